"""Lent GPUs in the simulator (`spec.scaling.prewarm.yieldToSleepers`), as the controller runs them: a lending
service's replicas are made awake on warm hosts (where another service's sleepers wait, their devices free, else one
made of the GPU the scheduler gives each); another service's sleepers wait there (made while the device was free: a
sleeper loads on the device before it sleeps); a burst's wake puts the lender's replica to sleep first
(`CyclePlan.displace`), the lender holds it asleep and takes no other GPU, and wakes it there once the borrower
gives the GPU back. Every decision is `plan_cycle`'s: the simulator only applies them to its cluster model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.cycle import CyclePlan, Observation
from infer_ctl.sim.catalogue import build_policy
from infer_ctl.sim.cluster import ClusterSpec
from infer_ctl.sim.fleet import simulate_fleet
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import InferCtl
from infer_ctl.sim.recipe import service_settings
from infer_ctl.sim.service import with_prewarm
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.warm import GIB, TierPhysics
from tests.sim.test_warm_tiers import run_within

TICK = 5.0


def service(name: str, arrivals: np.ndarray, seed: int, bounds: tuple[int, int], **prewarm: Any) -> FleetService:
    """A one-GPU service (its replicas take an H100 whole) within `bounds` replicas, with `prewarm` in its
    InferenceService's `spec.scaling.prewarm`."""
    settings = service_settings(name, ServiceModel(min_replicas=bounds[0], max_replicas=bounds[1],
                                                   cold_start_s=120.0, cold_start_sigma=0.0))
    return FleetService(name, arrivals, with_prewarm(settings, **prewarm), seed)


def run_lending(**lender: Any) -> tuple[Any, dict[str, list[tuple[Observation, CyclePlan]]]]:
    ticks = 720  # an hour
    rng = np.random.default_rng(7)
    # chat: quiet (one replica), a burst of 3 replicas' worth at 20-25 min; batch: from 10 min, steady, 2 replicas'
    # worth. No engine starts asleep: chat's sleepers load on their warm hosts' devices (the warm pool's two GPUs)
    # while those are free, and sleep; batch's replicas then join them awake (`place_awake`)
    rate = np.full(ticks, 3.0)
    rate[240:300] = 22.0
    chat = rng.poisson(rate * TICK).astype(np.float64)
    steady = np.full(ticks, 10.0)
    steady[:120] = 0.0
    batch = rng.poisson(steady * TICK).astype(np.float64)
    services = [service("chat", chat, 2, (1, 4), sleepingReplicas=2),
                service("batch", batch, 1, (0, 2), yieldToSleepers=True, **lender)]
    policies = [build_policy("infer-ctl+tiers", services[0].settings, chat, TICK),
                build_policy("infer-ctl", services[1].settings, batch, TICK)]
    assert all(isinstance(p, InferCtl) for p in policies)
    cycles: dict[str, list[tuple[Observation, CyclePlan]]] = {"batch": [], "chat": []}
    result = simulate_fleet(services, policies, ClusterSpec(1, 6), SimConfig(tick_s=TICK), initial=[1, 0],
                            physics=TierPhysics(pool_gpus=2),
                            on_cycle=lambda name, o, p: cycles[name].append((o, p)))
    return result, cycles


def test_a_burst_wakes_sleepers_on_gpus_a_lending_service_serves_on_and_it_gets_them_back() -> None:
    result, cycles = run_lending()
    batch, chat = cycles["batch"], cycles["chat"]
    # batch's replicas run on warm hosts, and chat's sleepers wait there
    settled = next(o for o, _ in batch if len(o.replicas) == 2 and all(
        r.state is ReplicaState.SERVING and r.warm_host for r in o.replicas))
    hosts = {r.warm_host for r in settled.replicas}
    asleep = [o for o, _ in chat if {r.warm_host for r in o.replicas if r.state is ReplicaState.SLEEPING} == hosts]
    assert asleep, [p.message for _, p in chat[:20]]
    # the burst's wakes put batch's replicas to sleep first
    displaced = [(o.samples[-1][0], p) for o, p in chat if p.displace]
    assert displaced and all(p.output.decision.urgent for _, p in displaced), [p.message for _, p in chat]
    burst_at = displaced[0][0]
    assert 1200 <= burst_at < 1500
    yielded = [o for o, _ in batch if any(r.yielded_s is not None for r in o.replicas)]
    assert yielded
    # meanwhile batch takes no other GPU (it waits for its own)
    assert all(not p.create for o, p in batch if any(r.yielded_s is not None for r in o.replicas))
    # chat gives them back after the burst, and batch's replicas wake there: the same replicas
    given = [o.samples[-1][0] for o, p in chat if "the GPUs given back" in p.message]
    assert given and given[0] > burst_at, [p.message for _, p in chat]
    back = [o for o, _ in batch if o.samples[-1][0] > given[0]
            and sum(r.state is ReplicaState.SERVING and r.yielded_s is None for r in o.replicas) == 2]
    assert back, [p.message for _, p in batch]
    assert {r.name for r in back[0].replicas} == {r.name for r in settled.replicas}
    # every GPU held is charged, and none twice
    assert np.all(result.gpus_held <= 6)
    assert result.gpu_hours == pytest.approx(result.gpus_held.sum() * TICK / 3600.0)


def test_a_lender_that_bounds_its_yields_never_has_more_of_its_replicas_asleep_for_others() -> None:
    # batch (2 replicas) lets one yield at a time (`maxYielded: 1`): chat's burst wakes one sleeper on a lent GPU
    # and starts a replica for the rest
    _, cycles = run_lending(maxYielded=1)
    batch, chat = cycles["batch"], cycles["chat"]
    assert any(p.displace for _, p in chat) and all(len(p.displace) <= 1 for _, p in chat)
    assert max(sum(r.yielded_s is not None for r in o.replicas) for o, _ in batch) == 1
    # the unbounded lender of the test above had both asleep at once
    _, unbounded = run_lending()
    assert max(sum(r.yielded_s is not None for r in o.replicas) for o, _ in unbounded["batch"]) == 2


@st.composite
def lending_fleets(draw: st.DrawFn) -> tuple[list[FleetService], list[str], ClusterSpec]:
    """1-2 lending services and 1-3 bursty services with sleeping pools, on a small cluster of whole GPUs."""
    cluster = ClusterSpec(draw(st.integers(1, 2)), draw(st.integers(2, 6)),
                          host_memory_bytes=draw(st.sampled_from([40 * GIB, 200 * GIB])))
    services, names = [], []
    for i in range(draw(st.integers(1, 2))):
        seed = draw(st.integers(0, 10_000))
        n = draw(st.integers(1, 3))
        arrivals = np.random.default_rng(seed).poisson(np.full(360, 4.0 * n) * TICK).astype(np.float64)
        services.append(service(f"lend{i}", arrivals, seed, (n, n), yieldToSleepers=True))
        names.append("infer-ctl")
    for i in range(draw(st.integers(1, 3))):
        seed = draw(st.integers(0, 10_000))
        rng = np.random.default_rng(seed)
        rate = np.repeat(rng.choice([0.0, 3.0, 20.0, 40.0], size=12), 30)
        services.append(service(f"burst{i}", rng.poisson(rate * TICK).astype(np.float64), seed, (1, 6),
                                sleepingReplicas=draw(st.integers(1, 3))))
        names.append("infer-ctl+tiers")
    return services, names, cluster


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lending_fleets())
def test_lending_never_holds_more_than_the_cluster_s_gpus_and_host_memory(
        fleet: tuple[list[FleetService], list[str], ClusterSpec]) -> None:
    # a wake or a displacement the cluster model disagrees with raises
    run_within(fleet)
