"""Which replica goes on scale-down: the one whose removal leaves the cluster least fragmented (FGD's measure
against the running mix), never a loading one."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.placement import removal_costs
from infer_ctl.engine.replicas import Replica, plan_replicas
from infer_ctl.place.frag import observed_mix
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.state import ClusterState


def shared_gpu(index: int) -> dict[str, Any]:
    return {"name": f"gpu-{index}", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": "80Gi"}}, "allowMultipleAllocations": True}


def cluster(holdings: dict[str, tuple[str, str]]) -> ClusterState:
    """One node with two 80Gi GPUs shared by memory; `holdings`: replica -> (device, memory it holds)."""
    node = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
    slice_ = {"metadata": {"name": "n1-gpus"},
              "spec": {"driver": "gpu.nvidia.com", "nodeName": "n1",
                       "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
                       "devices": [shared_gpu(0), shared_gpu(1)]}}
    claims = [{"metadata": {"name": f"{replica}-gpu", "namespace": "default"},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": device,
                    "consumedCapacity": {"memory": memory}}]}}}}
              for replica, (device, memory) in holdings.items()]
    return ClusterState.from_inventory(Inventory.build(nodes=[node], slices=[slice_], claims=claims))


@pytest.fixture
def state() -> ClusterState:
    # a holds 60Gi of gpu-0 (20Gi left, too little for anything that runs); b and c share gpu-1.
    return cluster({"a": ("gpu-0", "60Gi"), "b": ("gpu-1", "40Gi"), "c": ("gpu-1", "40Gi")})


def test_removing_the_replica_that_frees_a_whole_gpu_costs_least(state: ClusterState) -> None:
    costs = removal_costs(state, observed_mix(state.inventory), {r: f"default/{r}-gpu" for r in "abc"})
    # Before: 250 thousandths free, usable by nothing. Without a: gpu-0 is whole, nothing is wasted (-250).
    # Without b: 250 + 500 free, the 750 task still cannot run anywhere: fragmentation grows.
    assert costs["a"] == pytest.approx(-250)
    assert costs["b"] == costs["c"] > 0


def test_a_replica_whose_claim_holds_nothing_known_costs_nothing(state: ClusterState) -> None:
    assert removal_costs(state, observed_mix(state.inventory), {"z": "default/z-gpu"}) == {"z": 0.0}


def test_scale_down_removes_the_least_fragmenting_ready_replica_and_never_a_loading_one(state: ClusterState) -> None:
    costs = removal_costs(state, observed_mix(state.inventory), {r: f"default/{r}-gpu" for r in "abc"})
    ready = [Replica(r, ReplicaState.SERVING, standby=False) for r in "abc"]
    assert plan_replicas(ready, 2, 0, removal_cost=costs.__getitem__).remove == ("a",)
    loading_a = [Replica("a", ReplicaState.LOADING, standby=False), *ready[1:]]
    assert plan_replicas(loading_a, 1, 0, removal_cost=costs.__getitem__).remove == ("b",)


def test_without_a_snapshot_the_caller_s_removal_costs_say_which_replica_goes() -> None:
    # the simulator has no snapshot: it tells the cycle what removing each replica frees (r1 is alone on its GPU)
    from dataclasses import replace

    from infer_ctl.engine.cycle import CycleState, plan_cycle
    from tests.engine.test_cycle import CYCLE, T0, observe, ready, service

    svc = service(spec__replicas=2)
    obs = observe(svc, ready("llm-r0"), ready("llm-r1"), ready("llm-r2"), rate=5.0)
    for costs, gone in (({"llm-r0": 0.6, "llm-r1": 0.0, "llm-r2": 0.3}, "llm-r1"),
                        ({"llm-r0": 0.0, "llm-r1": 0.6, "llm-r2": 0.3}, "llm-r0")):
        plan = plan_cycle(replace(obs, removal_costs=costs), CycleState(), CYCLE, T0)[0]
        assert plan.actions.remove == (gone,), plan.message


def test_among_shares_the_one_on_the_emptiest_device_goes_first_to_drain_it() -> None:
    # 24Gi shares (300 thousandths of an 80Gi GPU): s1 beside two others on gpu-0, s2 beside one on gpu-1.
    state = cluster({"s1": ("gpu-0", "24Gi"), "o1": ("gpu-0", "24Gi"), "o2": ("gpu-0", "24Gi"),
                     "s2": ("gpu-1", "24Gi"), "o3": ("gpu-1", "24Gi")})
    costs = removal_costs(state, observed_mix(state.inventory), {r: f"default/{r}-gpu" for r in ("s1", "s2")})
    # Against a mix of 24Gi shares alone, fragmentation favours s1 (gpu-0's 100 unusable thousandths become 400,
    # room for one more) over s2 (gpu-1's 400 become 700: no change); but without s2, gpu-1 holds one share (300)
    # and the next removal there gives the GPU back, where without s1 both GPUs stay held with two each.
    assert costs["s1"] == pytest.approx(-100 + 600)
    assert costs["s2"] == pytest.approx(0 + 300)
    ready = [Replica(r, ReplicaState.SERVING, standby=False) for r in ("s1", "s2")]
    assert plan_replicas(ready, 1, 0, removal_cost=costs.__getitem__).remove == ("s2",)
