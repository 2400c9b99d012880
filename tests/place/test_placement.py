"""The placement engine over DRA objects: inventory, filters with reasons, device choice, claims."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_ctl.core.cel import compile_expression, prepare_activation
from infer_ctl.place.claims import pinned_claim
from infer_ctl.place.frag import TaskClass, WorkloadMix
from infer_ctl.place.framework import CycleContext, CycleInputs, Decision, Engine, apply
from infer_ctl.place.inventory import Inventory, Toleration
from infer_ctl.place.plugins import ProfileError, build_profile, gap_balance
from infer_ctl.place.request import Request, RequestError, Sharing, request_from_claim
from infer_ctl.place.state import ClusterState

GiB = 2**30


def place(inventory: Inventory, request: Request, inputs: CycleInputs | None = None,
          config: dict[str, Any] | None = None, seed: int = 0) -> tuple[Decision, ClusterState]:
    state = ClusterState.from_inventory(inventory)
    decision = Engine(build_profile(config)).schedule(request, state, inputs or CycleInputs(),
                                                       np.random.default_rng(seed))
    return decision, state


def exclusive(name: str = "r", count: int = 1, **kw: Any) -> Request:
    return Request(name, cpu_milli=kw.pop("cpu_milli", 1000), memory_bytes=kw.pop("memory_bytes", GiB),
                   sharing=Sharing.EXCLUSIVE, count=count, **kw)


def test_the_inventory_reads_devices_attributes_and_capacity_from_resource_slices(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0"), b.gpu("gpu-1")])],
                          device_classes=[b.device_class()])
    assert inv.problems == ()
    dev = inv.devices_on("n1")[0]
    assert dev.attribute("productName") == "NVIDIA A100-SXM4-80GB"
    assert dev.memory_bytes == 80 * GiB
    assert str(dev.attribute("cudaComputeCapability")) == "8.0.0"
    assert inv.free(dev).exclusive_free


BAD_INPUT = [
    ("a capacity that is not a quantity",
     lambda b: b.slice("n1", [{**b.gpu("gpu-0"), "capacity": {"memory": {"value": "80GB"}}}]),
     "spec.devices[0].capacity[memory].value"),
    ("a device without a name", lambda b: b.slice("n1", [{"attributes": {}}]), "spec.devices[0].name"),
    ("an attribute with two value kinds",
     lambda b: b.slice("n1", [{**b.gpu("gpu-0"), "attributes": {"x": {"string": "a", "int": 1}}}]),
     "spec.devices[0].attributes[x]"),
    ("a pool whose other slice is missing", lambda b: b.slice("n1", [b.gpu("gpu-0")], count=2),
     "resourceSliceCount"),
    ("a slice for a node that does not exist", lambda b: b.slice("ghost", [b.gpu("gpu-0")]), "spec.nodeName"),
]


@pytest.mark.parametrize(("case", "make", "path"), BAD_INPUT, ids=[f"{c} is left out with its field path"
                                                                   for c, _, _ in BAD_INPUT])
def test_malformed_slices_are_left_out_with_a_reason_and_never_crash(b: Any, case: str, make: Any, path: str) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[make(b)], device_classes=[b.device_class()])
    assert inv.devices == ()
    assert any(path in p.path for p in inv.problems), [str(p) for p in inv.problems]


def test_only_the_newest_generation_of_a_pool_is_used(b: Any) -> None:
    old = b.slice("n1", [b.gpu("gpu-0", product="old")], generation=1)
    new = b.slice("n1", [b.gpu("gpu-0", product="new")], generation=2)
    inv = Inventory.build(nodes=[b.node("n1")], slices=[old, new])
    assert [d.attribute("productName") for d in inv.devices] == ["new"]


def test_a_request_takes_whole_gpus_of_one_node(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1"), b.node("n2")],
                          slices=[b.slice("n1", [b.gpu("a0")]), b.slice("n2", [b.gpu("b0"), b.gpu("b1")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(count=2))
    assert decision.placement is not None
    assert decision.placement.node == "n2"
    assert sorted(d.name for d in decision.placement.devices) == ["b0", "b1"]


def test_eight_free_gpus_spread_over_nodes_are_not_an_eight_gpu_placement(b: Any) -> None:
    nodes = [b.node(f"n{i}") for i in range(4)]
    slices = [b.slice(f"n{i}", [b.gpu(f"g{i}a"), b.gpu(f"g{i}b")]) for i in range(4)]
    inv = Inventory.build(nodes=nodes, slices=slices, device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(count=8))
    assert decision.placement is None
    reason = next(r for r in decision.status.reasons if r.plugin == "PartitionAvailable")
    assert reason.nodes == 4
    assert "8 whole GPU(s) requested > 2 free" in reason.example


def test_an_allocated_device_is_not_offered_again(b: Any) -> None:
    inv = Inventory.build(
        nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0"), b.gpu("gpu-1")])],
        device_classes=[b.device_class()],
        claims=[b.claim("taken", allocated=[{"pool": "n1", "device": "gpu-0"}])])
    decision, _ = place(inv, exclusive())
    assert decision.placement is not None
    assert [d.name for d in decision.placement.devices] == ["gpu-1"]


def test_a_selector_on_the_product_filters_with_the_failing_expression_as_reason(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", product="NVIDIA L4")])],
                          device_classes=[b.device_class()])
    expr = "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100')"
    decision, _ = place(inv, exclusive(selectors=(expr,)))
    assert decision.placement is None
    reason = decision.status.reasons[0]
    assert reason.plugin == "Accelerator" and expr in reason.example


def test_a_selector_that_fails_at_runtime_excludes_the_device_and_says_why(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(selectors=("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",)))
    assert decision.placement is None
    assert "selector failed on this device" in decision.status.reasons[0].example


def test_compute_capability_is_compared_as_a_version(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1"), b.node("n2")],
                          slices=[b.slice("n1", [b.gpu("old", cc="7.5.0")]), b.slice("n2", [b.gpu("new", cc="9.0.0")])],
                          device_classes=[b.device_class()])
    expr = "device.attributes['gpu.nvidia.com'].cudaComputeCapability.compareTo(semver('8.0.0')) >= 0"
    decision, _ = place(inv, exclusive(selectors=(expr,)))
    assert decision.placement is not None and decision.placement.node == "n2"


def test_a_model_too_big_for_every_gpu_is_refused_with_the_sizes(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", memory="24Gi")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(device_memory_bytes=40 * GiB))
    assert decision.placement is None
    reason = decision.status.reasons[0]
    assert reason.code == "InsufficientDeviceMemory"
    assert "model needs 40 GiB of device memory, largest matching device has 24 GiB" in reason.example


def test_node_cpu_shortage_reports_requested_and_free(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1", cpu="4")], slices=[b.slice("n1", [b.gpu("gpu-0")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(cpu_milli=8000))
    assert decision.placement is None
    assert "CPU requested 8000m > free 4000m" in decision.status.reasons[0].example


def test_a_cordoned_node_and_an_untolerated_taint_are_filtered(b: Any) -> None:
    taint = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
    inv = Inventory.build(nodes=[b.node("n1", unschedulable=True), b.node("n2", taints=[taint]), b.node("n3")],
                          slices=[b.slice(n, [b.gpu(f"{n}-g")]) for n in ("n1", "n2", "n3")],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive())
    assert decision.placement is not None and decision.placement.node == "n3"
    tolerant = exclusive(pod_tolerations=(Toleration("dedicated", "Equal", "training", "NoSchedule"),))
    without_n3 = Inventory.build(nodes=[b.node("n1", unschedulable=True), b.node("n2", taints=[taint])],
                                 slices=[b.slice(n, [b.gpu(f"{n}-g")]) for n in ("n1", "n2")],
                                 device_classes=[b.device_class()])
    decision, _ = place(without_n3, exclusive())
    assert decision.placement is None
    assert {r.code for r in decision.status.reasons} == {"NodeUnschedulable", "TaintNotTolerated"}
    decision, _ = place(without_n3, tolerant)
    assert decision.placement is not None and decision.placement.node == "n2"


def test_a_device_taint_excludes_the_device_unless_the_request_tolerates_it(b: Any) -> None:
    taint = {"key": "gpu.nvidia.com/unhealthy", "value": "xid", "effect": "NoSchedule"}
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", taints=[taint])])],
                          device_classes=[b.device_class()])
    assert place(inv, exclusive())[0].placement is None
    tolerant = exclusive(tolerations=(Toleration("gpu.nvidia.com/unhealthy", "Exists"),))
    assert place(inv, tolerant)[0].placement is not None


def test_gpus_held_for_a_pending_gang_are_kept_free(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1"), b.node("n2")],
                          slices=[b.slice("n1", [b.gpu("a0"), b.gpu("a1")]), b.slice("n2", [b.gpu("b0")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(), CycleInputs(gang_reserved_gpus={"n1": 2, "n2": 1}))
    assert decision.placement is None
    assert any(r.code == "HeldForGang" and r.nodes == 2 for r in decision.status.reasons)
    decision, _ = place(inv, exclusive(), CycleInputs(gang_reserved_gpus={"n1": 1, "n2": 1}))
    assert decision.placement is not None and decision.placement.node == "n1"


def shared(memory: str, name: str = "s") -> Request:
    return request_from_claim(
        {"metadata": {"name": name}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {
                "memory": memory}}}}]}}}, cpu_milli=500, memory_bytes=GiB)


def test_a_shared_replica_takes_a_memory_share_rounded_up_by_the_request_policy(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", shareable=True)])],
                          device_classes=[b.device_class()])
    decision, state = place(inv, shared("19.5Gi"))
    assert decision.placement is not None
    assert decision.placement.consumed_capacity == {"gpu.nvidia.com/memory": Fraction(20 * GiB)}
    assert decision.placement.share_milli == 250
    apply(state, shared("19.5Gi"), decision)
    engine = Engine(build_profile())
    for _ in range(3):
        d = engine.schedule(shared("20Gi"), state, CycleInputs(), np.random.default_rng(0))
        assert d.placement is not None
        apply(state, shared("20Gi"), d)
    full = engine.schedule(shared("20Gi"), state, CycleInputs(), np.random.default_rng(0))
    assert full.placement is None
    assert "largest free share 0/1000" in full.status.reasons[0].example


def test_a_share_of_a_gpu_that_cannot_be_shared_is_refused(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0")])],
                          device_classes=[b.device_class()])
    assert place(inv, shared("10Gi"))[0].placement is None


def mig_node(b: Any) -> Inventory:
    parent = "GPU-parent"
    devices = [b.gpu("gpu-0", uuid=parent),
               b.mig("mig-0", "1g.10gb", "9728Mi", parent),
               b.mig("mig-1", "3g.40gb", "40192Mi", parent),
               b.gpu("gpu-1", uuid="GPU-other")]
    return Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", devices)], device_classes=[b.device_class()])


def test_mig_takes_the_smallest_profile_whose_memory_fits(b: Any) -> None:
    inv = mig_node(b)
    request = Request("m", cpu_milli=100, sharing=Sharing.MIG, device_memory_bytes=9 * GiB)
    decision, state = place(inv, request)
    assert decision.placement is not None
    assert [d.name for d in decision.placement.devices] == ["mig-0"]
    apply(state, request, decision)
    # The parent GPU is now partitioned: it cannot be taken whole, the other GPU can.
    d = Engine(build_profile()).schedule(exclusive(), state, CycleInputs(), np.random.default_rng(0))
    assert d.placement is not None and [x.name for x in d.placement.devices] == ["gpu-1"]


def test_a_model_too_big_for_every_mig_profile_is_unfit(b: Any) -> None:
    decision, _ = place(mig_node(b), Request("m", sharing=Sharing.MIG, device_memory_bytes=60 * GiB))
    assert decision.placement is None
    assert decision.status.reasons[0].code == "InsufficientDeviceMemory"


def test_partitionable_devices_share_the_gpus_counters(b: Any) -> None:
    counters = [{"name": "gpu-0-set", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}}}]
    whole = {"counterSet": "gpu-0-set", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}}}
    small = {"counterSet": "gpu-0-set", "counters": {"memory": {"value": "40Gi"}, "slices": {"value": "4"}}}
    devices = [b.gpu("gpu-0", counters=whole),
               b.mig("gpu-0-mig-a", "4g.40gb", "40Gi", "", counters=small),
               b.mig("gpu-0-mig-b", "4g.40gb", "40Gi", "", counters=small)]
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", devices, shared_counters=counters)],
                          device_classes=[b.device_class()])
    request = Request("m", sharing=Sharing.MIG, device_memory_bytes=30 * GiB)
    decision, state = place(inv, request)
    assert decision.placement is not None
    apply(state, request, decision)
    # 3 of 7 slices are left: a second 4-slice partition does not fit, nor does the whole GPU.
    engine = Engine(build_profile())
    assert engine.schedule(request, state, CycleInputs(), np.random.default_rng(0)).placement is None
    assert engine.schedule(exclusive(), state, CycleInputs(), np.random.default_rng(0)).placement is None


def test_fragmentation_prefers_the_gpu_that_keeps_whole_gpus_whole(b: Any) -> None:
    inv = Inventory.build(
        nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", shareable=True), b.gpu("gpu-1", shareable=True)])],
        device_classes=[b.device_class()])
    state = ClusterState.from_inventory(inv)
    engine = Engine(build_profile({"scores": {"Fragmentation": 1}}))
    mix = WorkloadMix((TaskClass(0, 1000, 1), TaskClass(0, 500, 1)), (0.5, 0.5))
    first = engine.schedule(shared("40Gi"), state, CycleInputs(workload=mix), np.random.default_rng(0))
    assert first.placement is not None
    apply(state, shared("40Gi"), first)
    second = engine.schedule(shared("20Gi"), state, CycleInputs(workload=mix), np.random.default_rng(0))
    assert second.placement is not None
    # The second share goes on the GPU already in use, which leaves the other one whole for 1-GPU tasks.
    assert second.placement.devices == first.placement.devices


def test_spreading_and_cache_locality_steer_between_equal_nodes(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1"), b.node("n2")],
                          slices=[b.slice("n1", [b.gpu("a")]), b.slice("n2", [b.gpu("b")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(), CycleInputs(service_replicas={"n1": 1}))
    assert decision.placement is not None and decision.placement.node == "n2"
    decision, _ = place(inv, exclusive(), CycleInputs(cached_nodes=frozenset({"n1"})))
    assert decision.placement is not None and decision.placement.node == "n1"


def test_the_pinned_claim_is_valid_v1_and_selects_exactly_the_chosen_device(b: Any) -> None:
    import kubernetes_validate

    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu(f"gpu-{i}") for i in range(4)])],
                          device_classes=[b.device_class()],
                          claims=[b.claim("x", allocated=[{"pool": "n1", "device": "gpu-0"}])])
    request = exclusive(count=2)
    decision, _ = place(inv, request)
    assert decision.placement is not None
    pinned = pinned_claim(decision.placement, request, inv, name="svc-0", namespace="ml")
    kubernetes_validate.validate(pinned.claim, "1.37.0", strict=True)
    assert pinned.pinned_by_uuid and pinned.node_selector == {"kubernetes.io/hostname": "n1"}
    exprs = [s["cel"]["expression"] for s in pinned.claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]]
    selected = [d.id for d in inv.devices
                if all(compile_expression(e, variables=("device",)).evaluate_bool(
                    prepare_activation({"device": d.cel_value()})) for e in exprs)]
    assert sorted(selected, key=str) == sorted(decision.placement.devices, key=str)


def test_a_pinned_shared_claim_requests_the_consumed_capacity(b: Any) -> None:
    import kubernetes_validate

    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", shareable=True)])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, shared("10Gi"))
    assert decision.placement is not None
    pinned = pinned_claim(decision.placement, shared("10Gi"), inv, name="svc-0", namespace="ml")
    kubernetes_validate.validate(pinned.claim, "1.37.0", strict=True)
    assert pinned.claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": str(10 * GiB)}}


CLAIM_ERRORS = [
    ({"spec": {"devices": {"requests": [{"name": "a"}]}}}, "exactly: required"),
    ({"spec": {"devices": {"requests": [{"name": "a", "exactly": {}}]}}}, "deviceClassName: required"),
    ({"spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "x", "count": 0}}]}}},
     "count: must be a positive integer"),
    ({"spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "x", "capacity": {
        "requests": {"memory": "ten"}}}}]}}}, "capacity.requests[memory]"),
]


@pytest.mark.parametrize(("claim", "needle"), CLAIM_ERRORS, ids=[f"a claim with {n!r} is rejected"
                                                                 for _, n in CLAIM_ERRORS])
def test_a_claim_the_engine_cannot_place_is_rejected_naming_the_field(claim: dict[str, Any], needle: str) -> None:
    with pytest.raises(RequestError, match=r"spec\.devices\.requests") as info:
        request_from_claim({"metadata": {"name": "c"}, **claim})
    assert needle in str(info.value)


def test_the_placement_policy_names_known_plugins_only() -> None:
    with pytest.raises(ProfileError, match="Magic"):
        build_profile({"scores": {"Magic": 1}})
    with pytest.raises(ProfileError, match="weight"):
        build_profile({"scores": {"BestFit": -1}})


def test_the_policy_file_builds_a_profile() -> None:
    from pathlib import Path

    import yaml

    from infer_ctl.core.policy import parse_placement_policy

    doc = yaml.safe_load((Path(__file__).parents[2] / "policies" / "placement.yaml").read_text())
    policy = parse_placement_policy(doc)
    profile = build_profile({"filters": list(policy.filters), "scores": dict(policy.score_weights)})
    assert {p.name for p, _ in profile.scores} >= {"Fragmentation", "BestFit"}


requests_strategy = st.lists(
    st.one_of(
        st.builds(lambda c, n: Request(f"e{c}{n}", cpu_milli=c, sharing=Sharing.EXCLUSIVE, count=n),
                  st.integers(0, 16000), st.integers(1, 4)),
        st.builds(lambda c, g: shared(f"{g}Gi", name=f"s{c}{g}"), st.integers(0, 4000), st.integers(1, 80)),
        st.builds(lambda c: Request(f"c{c}", cpu_milli=c), st.integers(1, 16000)),
    ),
    min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests_strategy)
def test_no_device_or_node_is_ever_over_allocated_and_scheduling_never_mutates_the_snapshot(
    b: Any, requests: list[Request]
) -> None:
    nodes = [b.node(f"n{i}", cpu="32") for i in range(3)]
    slices = [b.slice(f"n{i}", [b.gpu(f"n{i}-g{j}", shareable=True) for j in range(2 + i)]) for i in range(3)]
    state = ClusterState.from_inventory(Inventory.build(nodes=nodes, slices=slices, device_classes=[b.device_class()]))
    engine = Engine(build_profile())
    mix = WorkloadMix((TaskClass(1000, 1000, 1), TaskClass(500, 250, 1)), (0.5, 0.5))
    for req in requests:
        before = (state.free_milli.copy(), state.cpu_free.copy(), state.version.copy())
        decision = engine.schedule(req, state, CycleInputs(workload=mix), np.random.default_rng(1))
        assert (state.free_milli == before[0]).all() and (state.cpu_free == before[1]).all()
        assert (state.version == before[2]).all()
        if decision.placement is not None:
            apply(state, req, decision)
        assert (state.free_milli >= 0).all()
        assert (state.cpu_free >= 0).all()


def test_a_device_class_whose_cel_does_not_compile_matches_nothing_and_says_why(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0")])],
                          device_classes=[b.device_class("broken", "device.driver ==")])
    assert any(p.kind == "DeviceClass" and "Syntax error" in p.message for p in inv.problems)
    decision, _ = place(inv, exclusive(device_class="broken"))
    assert decision.placement is None
    assert "does not compile" in decision.status.reasons[0].example


def test_capacity_consumed_by_existing_claims_is_not_offered_again(b: Any) -> None:
    inv = Inventory.build(
        nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", shareable=True)])],
        device_classes=[b.device_class()],
        claims=[b.claim("other", capacity={"memory": "40Gi"},
                        allocated=[{"pool": "n1", "device": "gpu-0", "shareID": "a1b2",
                                    "consumedCapacity": {"memory": "40Gi"}}])])
    assert place(inv, shared("50Gi"))[0].placement is None
    assert place(inv, shared("40Gi"))[0].placement is not None


def test_a_plugin_defect_is_an_error_status_not_an_exception(b: Any) -> None:
    from infer_ctl.place.framework import Code, Profile

    class Broken:
        name = "Broken"

        def filter(self, ctx: Any) -> Any:
            raise RuntimeError("boom")

    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0")])],
                          device_classes=[b.device_class()])
    state = ClusterState.from_inventory(inv)
    decision = Engine(Profile("broken", (Broken(),), ())).schedule(exclusive(), state, CycleInputs(),
                                                                   np.random.default_rng(0))
    assert decision.placement is None
    assert decision.status.code is Code.ERROR and "boom" in decision.status.message


def test_the_observed_mix_comes_from_the_allocated_claims(b: Any) -> None:
    from infer_ctl.place.frag import observed_mix

    inv = Inventory.build(
        nodes=[b.node("n1")],
        slices=[b.slice("n1", [b.gpu("g0", shareable=True, memory="80Gi"), b.gpu("g1"), b.gpu("g2")])],
        device_classes=[b.device_class()],
        claims=[b.claim("share", allocated=[{"pool": "n1", "device": "g0", "consumedCapacity": {"memory": "20Gi"}}]),
                b.claim("pair", allocated=[{"pool": "n1", "device": "g1"}, {"pool": "n1", "device": "g2"}])])
    mix = observed_mix(inv)
    assert set(mix.classes) == {TaskClass(0, 250, 1), TaskClass(0, 1000, 2)}
    assert mix.popularity == (0.5, 0.5)


def test_whole_gpus_of_one_replica_are_of_one_product(b: Any) -> None:
    mixed = [b.gpu("a100", product="NVIDIA A100-SXM4-80GB"), b.gpu("l4", product="NVIDIA L4", memory="24Gi")]
    inv = Inventory.build(nodes=[b.node("n1")], slices=[b.slice("n1", mixed)], device_classes=[b.device_class()])
    assert place(inv, exclusive(count=2))[0].placement is None
    single, _ = place(inv, exclusive(count=1))
    assert single.placement is not None


def test_without_a_workload_mix_a_small_model_is_kept_off_the_big_gpu(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("big"), b.node("small")],
                          slices=[b.slice("big", [b.gpu("h", memory="80Gi")]),
                                  b.slice("small", [b.gpu("l", product="NVIDIA L4", memory="24Gi")])],
                          device_classes=[b.device_class()])
    decision, _ = place(inv, exclusive(device_memory_bytes=10 * GiB))
    assert decision.placement is not None and decision.placement.node == "small"
    decision, _ = place(inv, exclusive(device_memory_bytes=40 * GiB))
    assert decision.placement is not None and decision.placement.node == "big"


def test_a_claim_without_recorded_consumption_takes_the_policy_default_of_a_shared_gpu(b: Any) -> None:
    inv = Inventory.build(
        nodes=[b.node("n1")], slices=[b.slice("n1", [b.gpu("gpu-0", shareable=True)])],
        device_classes=[b.device_class()],
        claims=[b.claim("whole", allocated=[{"pool": "n1", "device": "gpu-0"}])])
    assert inv.free(inv.devices[0]).capacity_free == {"gpu.nvidia.com/memory": Fraction(0)}
    assert place(inv, shared("10Gi"))[0].placement is None


def test_gap_balance_prefers_filling_a_common_gap_over_the_tightest_rare_one(b: Any) -> None:
    # One GPU with a 300/1000 gap, four with a 500/1000 gap (each node one shareable 80Gi GPU).
    used = {"n0": "56Gi", "n1": "40Gi", "n2": "40Gi", "n3": "40Gi", "n4": "40Gi"}
    inv = Inventory.build(
        nodes=[b.node(n) for n in used],
        slices=[b.slice(n, [b.gpu(f"gpu-{n}", shareable=True)]) for n in used],
        device_classes=[b.device_class()],
        claims=[b.claim(f"c-{n}", capacity={"memory": m},
                        allocated=[{"pool": n, "device": f"gpu-{n}", "shareID": f"s{i}",
                                    "consumedCapacity": {"memory": m}}])
                for i, (n, m) in enumerate(used.items())])
    state = ClusterState.from_inventory(inv)
    request = shared("16Gi")
    ctx = CycleContext(request, state, CycleInputs(), state.eligible(request), state.share_needed(request),
                       np.random.default_rng(0))
    nodes = np.arange(len(state.nodes))
    balance = gap_balance(ctx, nodes, np.zeros(nodes.size, dtype=np.int64))
    gaps = {state.nodes[i].name: int(state.free_milli[i, 0]) for i in nodes}
    assert gaps == {"n0": 300, "n1": 500, "n2": 500, "n3": 500, "n4": 500}
    # Into the 300 gap: sum of squares changes by (0-1) + (1-0) = 0; into a 500 gap: (9-16) + (4-1) = -4.
    by_node = dict(zip((state.nodes[i].name for i in nodes), balance, strict=True))
    assert by_node["n0"] == 0.0
    assert all(by_node[n] == 1.0 for n in ("n1", "n2", "n3", "n4"))


def test_a_node_without_a_chosen_gpu_gets_no_gap_balance(b: Any) -> None:
    inv = Inventory.build(nodes=[b.node("n1"), b.node("n2")],
                          slices=[b.slice(n, [b.gpu(f"gpu-{n}", shareable=True)]) for n in ("n1", "n2")],
                          device_classes=[b.device_class()])
    state = ClusterState.from_inventory(inv)
    request = shared("16Gi")
    ctx = CycleContext(request, state, CycleInputs(), state.eligible(request), state.share_needed(request),
                       np.random.default_rng(0))
    balance = gap_balance(ctx, np.array([0, 1]), np.array([0, -1]))
    assert list(balance) == [1.0, 0.0]
