"""The controller's placement on the fleet simulator's cluster (`infer_ctl.sim.placing`): the snapshot the fleet's
bindings make, the pins `place_replicas` gives infer-ctl's new replicas, the removal costs, and the fleet run with
it."""

from __future__ import annotations

import numpy as np
import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.place.framework import Engine
from infer_ctl.place.plugins import build_profile
from infer_ctl.sim.catalogue import build_policy, initial_replicas
from infer_ctl.sim.cluster import ClusterSpec, FleetCluster, device_bytes
from infer_ctl.sim.fleet import simulate_fleet
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.placing import FleetPlacement, Pin, claim_key
from infer_ctl.sim.recipe import service_settings
from infer_ctl.sim.service import scenario_service
from infer_ctl.sim.tick import SimConfig

GIB = 2**30
H100 = device_bytes("H100-80GB")


def placement(nodes: int, gpus: int, *, shared: bool) -> FleetPlacement:
    policies = load_policies()
    engine = Engine(build_profile({"filters": list(policies.placement.filters),
                                   "scores": dict(policies.placement.score_weights)}))
    return FleetPlacement(nodes=nodes, gpus_per_node=gpus, accelerator="H100-80GB", catalog=policies.catalog,
                          engine=engine, shared=shared)


def shared_service(gib: float = 24.0):  # type: ignore[no-untyped-def]
    return scenario_service(service_settings("a", ServiceModel(min_replicas=0, memory_share_gib=gib)))


def test_the_snapshot_lays_each_node_out_shared_devices_then_whole_gpus_then_free_ones() -> None:
    c = FleetCluster(ClusterSpec(nodes=2, gpus_per_node=4))
    c.bind_share(0, "a-1", 1, None, nbytes=24 * GIB, priority=100_000, now=0.0)
    device = c.share_of[(0, "a-1")][1]
    c.bind_share(1, "b-1", 1, device, nbytes=40 * GIB, priority=100_000, now=0.0)
    c.bind((2, "x"), "x-1", 1, gpus=2, priority=100_000, now=0.0)
    p = placement(2, 4, shared=True)
    state = p.snapshot(c.layout())
    node = state.slot_of[p._device(1, 0)][0]
    other = state.slot_of[p._device(0, 0)][0]
    assert list(state.free_milli[other]) == [1000] * 4
    free = list(state.free_milli[node])
    assert free[0] == pytest.approx(1000 * (H100 - 64 * GIB) / H100, abs=1)  # the shared device's 64 GiB taken
    assert free[1:] == [0, 0, 1000]  # x's two GPUs whole, one free


def test_a_share_is_pinned_where_fgd_puts_it_against_the_running_mix() -> None:
    """The controller's choice, whatever the simulator's own rule would be: against a mix of 48 GiB shares alone, a
    24 GiB share goes beside one (31.6 GiB left: the gap stays too small for the mix either way), and the next
    ones of the cycle each on a GPU of their own, keeping 55.6 GiB gaps a 48 GiB share still fits (FGD); with
    whole-GPU Pods in the mix, the shares of a cycle fill one opened GPU instead (a partly used GPU is lost to a
    whole-GPU Pod, so a second one is not opened)."""
    c = FleetCluster(ClusterSpec(nodes=2, gpus_per_node=4))
    c.bind_share(1, "b-1", 1, None, nbytes=48 * GIB, priority=100_000, now=0.0)
    device = c.share_of[(1, "b-1")][1]
    p = placement(2, 4, shared=True)
    p.snapshot(c.layout())
    svc = shared_service(24.0)
    pins = p.place(svc, 0, ["a-1", "a-2", "a-3"], service_nodes={}, cached_nodes=())
    assert pins[0] == Pin(1, 0, device)
    assert all(pin is not None and pin.device is None for pin in pins[1:])
    assert len({(pin.node, pin.slot) for pin in pins[1:] if pin is not None}) == 2  # spread: 55.6 GiB gaps
    c.bind((2, "x"), "x-1", 0, gpus=1, priority=100_000, now=0.0)  # a whole-GPU Pod: the mix has one now
    c.bind((2, "x"), "x-2", 1, gpus=1, priority=100_000, now=0.0)
    c.release(1, "b-1", 1, now=1.0)
    p.snapshot(c.layout())
    pins = p.place(svc, 0, ["a-1", "a-2", "a-3"], service_nodes={}, cached_nodes=())
    assert all(pin is not None and pin.device is None for pin in pins)
    assert len({(pin.node, pin.slot) for pin in pins if pin is not None}) == 1  # 3 x 24 GiB on one GPU


def test_removing_the_last_share_of_a_device_goes_first_whatever_the_mix() -> None:
    c = FleetCluster(ClusterSpec(nodes=1, gpus_per_node=4))
    c.bind_share(0, "a-1", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)
    device = c.share_of[(0, "a-1")][1]
    c.bind_share(1, "b-1", 0, device, nbytes=40 * GIB, priority=100_000, now=0.0)
    c.bind_share(0, "a-2", 0, None, nbytes=24 * GIB, priority=100_000, now=0.0)  # alone on another GPU
    p = placement(1, 4, shared=True)
    p.snapshot(c.layout())
    # shares alone in the mix: a GPU made whole again is no gap any share needs (FGD counts no change, and a-1's
    # going leaves b's device a gap a 24 GiB share fits in), but b's device stays held (500 thousandths)
    alone = p.removal_costs(0, ["a-1", "a-2", "gone"])
    assert alone["a-2"] == 0.0 and alone["a-2"] < alone["a-1"] < 500.0
    assert alone["gone"] == 0.0  # a replica with no claim changes no device
    c.bind((2, "x"), "x-1", 0, gpus=1, priority=100_000, now=0.0)
    p.snapshot(c.layout())
    mixed = p.removal_costs(0, ["a-1", "a-2"])
    assert mixed["a-2"] < 0.0 < mixed["a-1"]  # with whole-GPU Pods in the mix, the GPU made whole again counts too
    assert claim_key(0, "a-1") != claim_key(1, "a-1")  # replicas of two services never share a claim


def test_whole_gpu_replicas_are_pinned_to_nodes_with_free_gpus_and_none_when_full() -> None:
    c = FleetCluster(ClusterSpec(nodes=2, gpus_per_node=2))
    c.bind((1, "x"), "x-1", 0, gpus=2, priority=100_000, now=0.0)
    p = placement(2, 2, shared=False)
    p.snapshot(c.layout())
    svc = scenario_service(service_settings("a", ServiceModel(min_replicas=0)))
    pins = p.place(svc, 0, ["a-1", "a-2", "a-3"], service_nodes={}, cached_nodes=())
    assert [pin.node if pin else None for pin in pins] == [1, 1, None]


def test_a_fleet_run_with_the_controllers_placement_pins_every_start_and_overfills_nothing() -> None:
    tick = 5.0
    rng = np.random.default_rng(3)
    rate = np.repeat(rng.choice([0.0, 5.0, 20.0, 60.0], size=8), 30)
    services = [FleetService(f"s{i}", rng.poisson(rate * tick).astype(np.float64),
                             service_settings(f"s{i}", ServiceModel(cold_start_s=60.0, min_replicas=0,
                                                                    memory_share_gib=share)), i)
                for i, share in enumerate((24.0, 40.0, 0.0))]
    policies = [build_policy("infer-ctl", s.settings, s.arrivals, tick) for s in services]
    initial = [initial_replicas(s.arrivals, tick, s.settings.model) for s in services]
    seen: list[tuple[str, ...]] = []  # per cycle with replicas: the replicas the controller's costs rank
    r = simulate_fleet(services, policies, ClusterSpec(2, 4), SimConfig(tick_s=tick), initial=initial,
                       placement=True, on_cycle=lambda _, obs, __: seen.append(tuple(sorted(
                           obs.removal_costs or ()))) if obs.replicas else None)
    assert seen and r.cold_starts > 0
    assert all(ranked for ranked in seen)  # every cycle's surplus is ranked by removal_costs on the snapshot
    assert np.all(r.gpus_held <= 8)
    assert sum(s.gpu_hours for s in r.services) == pytest.approx(r.gpus_held.sum() * tick / 3600)


def test_infer_ctls_replicas_at_t0_are_where_the_controllers_placement_puts_them() -> None:
    """The fleet's warm start lays out infer-ctl's replicas as its first cycle would have placed them, not by the
    simulator's rule: five 24 GiB shares of one service on three nodes of two H100s go as `place_replicas` pins
    them on the empty cluster (here two GPUs of one node, the other nodes left whole), where the rule would open
    the second device on the node with the most free GPUs."""
    tick = 5.0
    settings = service_settings("a", ServiceModel(cold_start_s=60.0, min_replicas=0, memory_share_gib=24.0))
    service = FleetService("a", np.full(24, 40.0 * tick), settings, 0)
    names = [f"sim-{i}" for i in range(1, 6)]
    p = placement(3, 2, shared=True)
    p.snapshot(FleetCluster(ClusterSpec(nodes=3, gpus_per_node=2)).layout())
    pins = p.place(shared_service(24.0), 0, names, service_nodes={}, cached_nodes=())
    expected = sorted((name, f"node-{pin.node}") for name, pin in zip(names, pins, strict=True) if pin is not None)
    assert len(expected) == 5

    def layout_at_t0(placement: bool) -> list[tuple[str, str]]:
        first: list[list[tuple[str, str]]] = []
        simulate_fleet([service], [build_policy("infer-ctl", settings, service.arrivals, tick)], ClusterSpec(3, 2),
                       SimConfig(tick_s=tick), initial=[5], placement=placement,
                       on_cycle=lambda _, obs, __: None if first else first.append(
                           sorted((r.name, r.node) for r in obs.replicas)))
        return first[0]

    assert layout_at_t0(True) == expected
    assert layout_at_t0(False) != expected  # the rule's layout: what the test tells apart
