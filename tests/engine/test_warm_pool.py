"""The warm pool (`warmPoolGPUs`) in `plan_cycle`: whole GPUs a namespace may hold as warm hosts with no model
awake, for the sleepers of services whose replica takes a GPU whole (one sleeper of each such service per host).
Its sleepers are a burst pool: woken only for load already here (whichever service's burst comes first), never
the forecast's room; the pool makes new hosts only while fewer than its size are idle, and its idle hosts beyond
its size lose their whole-GPU sleepers (the GPU is then freed)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from infer_ctl.core.errors import SpecError
from infer_ctl.core.policy import parse_scaling_policy
from infer_ctl.decide.tiers import Tier
from infer_ctl.engine.cycle import CyclePlan, CycleState, Observation, WarmDevice, WarmHosts, plan_cycle, weight_bytes
from tests.engine.test_cycle import CYCLE, T0, observe, ready
from tests.engine.test_sleeping_cycle import GIB, GPU, asleep, exclusive, held_warm

H100 = "H100-80GB"
ROOT = Path(__file__).resolve().parents[2]


def pooled(*devices: WarmDevice, pool: int, elsewhere: int = 0, budget: int = 400 * GIB) -> WarmHosts:
    nodes = {d.node for d in devices}
    return WarmHosts(devices, dict.fromkeys(nodes, budget), dict.fromkeys(nodes, 0), pool_gpus=pool,
                     idle_elsewhere=elsewhere)


def free(node: str, slot: int) -> WarmDevice:
    return WarmDevice(f"warm-{node}-gpu-{slot}", node, H100, GPU, exists=False)


FREE = (free("h100-0", 1), free("h100-0", 2), free("h100-1", 1))


def bursty(**fields: object) -> Observation:
    """An `Exclusive` service (a GPU whole per replica) with the sleeping tier and a pool of two sleepers."""
    return observe(exclusive(spec__scaling__prewarm__sleepingReplicas=2, **fields), ready("llm-r0"), rate=5.0)


def plan(obs: Observation, state: CycleState | None = None) -> CyclePlan:
    return plan_cycle(obs, state or held_warm(1), CYCLE, T0)[0]


def test_the_pool_s_room_is_its_size_less_its_idle_hosts_and_its_surplus_the_idle_hosts_with_fewest_sleepers() -> None:
    a = WarmDevice("warm-a", "h100-0", H100, GPU, sleepers=3)
    b = WarmDevice("warm-b", "h100-0", H100, GPU, sleepers=1)
    busy = WarmDevice("warm-c", "h100-1", H100, GPU, awake_bytes=GPU, sleepers=2)
    shared = WarmDevice("warm-d", "h100-1", H100, GPU, sleepers=2, whole=False)  # a Shared service's: not the pool's
    assert pooled(a, b, busy, shared, *FREE, pool=4).pool() == (2, frozenset())
    assert pooled(a, b, busy, shared, pool=2, elsewhere=1).pool() == (0, frozenset({"warm-b"}))
    assert pooled(a, b, pool=0).pool() == (0, frozenset({"warm-a", "warm-b"}))


def test_a_whole_gpu_service_makes_warm_hosts_only_as_far_as_the_pool_has_room() -> None:
    for pool, made in ((0, 0), (1, 1), (2, 2), (5, 2)):
        p = plan(replace(bursty(), warm_hosts=pooled(*FREE, pool=pool)))
        sleepers = [r for r in p.create if r.sleeping]
        assert len(sleepers) == made, (pool, p.message)
        # one per host (each could wake at once), each taking its GPU whole awake
        assert all(n == 1 for n in Counter(r.warm_host for r in sleepers).values())
        assert all(r.device_bytes == GPU for r in sleepers)
    # an idle host of the pool (another service's sleeper on it) is joined before a new one is made
    other = WarmDevice("warm-a", "h100-0", H100, GPU, sleepers=1)
    p = plan(replace(bursty(), warm_hosts=pooled(other, *FREE, pool=2)))
    assert sorted(r.warm_host for r in p.create if r.sleeping) == ["warm-a", FREE[0].claim], p.message


def test_the_pool_is_a_burst_pool_not_the_forecast_s_room() -> None:
    p = plan(replace(bursty(), warm_hosts=pooled(*FREE, pool=2)))
    # the awake replicas cover the cold start as without the tier: a sleeper there may find its GPU taken
    assert p.output.tiers is not None
    horizons = dict(p.output.tiers.horizons_s)
    assert horizons[Tier.STANDBY] >= 120, horizons
    # a forecast's rise (the minimum raised: no load here) creates rather than wake a pool sleeper
    hosts = pooled(WarmDevice("warm-a", "h100-0", H100, GPU, sleepers=1), pool=2)
    calm = plan(replace(observe(exclusive(spec__scaling__minReplicas=2,
                                          spec__scaling__prewarm__sleepingReplicas=1),
                                ready("llm-r0"), asleep("llm-r1", "warm-a"), rate=0.0), warm_hosts=hosts))
    assert calm.actions.wake == () and calm.actions.create_serving == 1, calm.message
    # the load already here wakes it
    burst = plan(replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=1), ready("llm-r0"),
                                 asleep("llm-r1", "warm-a"), rate=18.0), warm_hosts=hosts), held_warm(2))
    assert burst.actions.wake == ("llm-r1",) and burst.actions.create_serving == 0, burst.message


def test_a_scale_down_puts_the_replica_on_the_pool_s_host_to_sleep_before_removing_one_elsewhere() -> None:
    hosts = pooled(WarmDevice("warm-a", "h100-0", H100, GPU, awake_bytes=GPU, sleepers=0), pool=1)
    woken = ready("llm-r1", warm_host="warm-a")
    p = plan(replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=1), ready("llm-r0"), woken,
                             rate=5.0), warm_hosts=hosts), held_warm(1, awake=1))
    assert p.actions.sleep == ("llm-r1",) and p.actions.remove == (), p.message


def test_whole_gpu_sleepers_leave_the_pool_s_idle_hosts_beyond_its_size() -> None:
    # two idle hosts, a pool of one: the one with fewer sleepers (b, this service's alone) is surplus
    a = WarmDevice("warm-a", "h100-0", H100, GPU, sleepers=3)
    b = WarmDevice("warm-b", "h100-1", H100, GPU, sleepers=1)
    obs = observe(exclusive(spec__scaling__prewarm__sleepingReplicas=2), ready("llm-r0"), asleep("llm-r1", "warm-a"),
                  asleep("llm-r2", "warm-b"), rate=5.0)
    p = plan(replace(obs, warm_hosts=pooled(a, b, pool=1)), held_warm(1))
    assert p.actions.remove == ("llm-r2",), p.message
    assert "removed from warm hosts" in p.message
    # within the pool's size both stay
    kept = plan(replace(obs, warm_hosts=pooled(a, b, pool=2)), held_warm(1))
    assert kept.actions.remove == () and kept.actions.create_sleeping == 0, kept.message


@given(kinds=st.lists(st.sampled_from(["free", "idle", "busy", "mine"]), min_size=1, max_size=8),
       pool=st.integers(0, 6), rate=st.floats(0.0, 60.0), budget_gib=st.integers(0, 200),
       sleeping=st.integers(0, 4))
@settings(max_examples=200, deadline=None)
def test_the_pool_never_grows_past_its_size_nor_wakes_where_a_model_is_awake(
        *, kinds: list[str], pool: int, rate: float, budget_gib: int, sleeping: int) -> None:
    # device i: a free GPU, an idle host of the pool (another service's sleeper on it), a host another model is
    # awake on, or an idle host holding this service's sleeper
    devices, replicas = [], [ready("llm-r0")]
    for i, kind in enumerate(kinds):
        node = f"h100-{i % 2}"
        if kind == "free":
            devices.append(free(node, i))
        elif kind == "busy":
            devices.append(WarmDevice(f"warm-{i}", node, H100, GPU, awake_bytes=GPU, sleepers=1))
        else:
            devices.append(WarmDevice(f"warm-{i}", node, H100, GPU, sleepers=1))
            if kind == "mine":
                replicas.append(asleep(f"llm-s{i}", f"warm-{i}"))
    warm = pooled(*devices, pool=pool, budget=budget_gib * GIB)
    svc = exclusive(spec__scaling__prewarm__sleepingReplicas=sleeping, spec__scaling__maxReplicas=8)
    p = plan(replace(observe(svc, *replicas, rate=rate), warm_hosts=warm), held_warm(1))
    room, _ = warm.pool()
    by_claim = {d.claim: d for d in devices}
    made = [r.warm_host for r in p.create if r.sleeping and not by_claim[r.warm_host].exists]
    assert len(made) <= room, (room, p.message)
    # one of its sleepers per device at most (a second could not wake while the first is awake)
    mine = Counter([r.warm_host for r in p.create if r.sleeping] +
                   [r.warm_host for r in replicas if r.warm_host and r.name not in p.actions.remove])
    assert all(n == 1 for n in mine.values()), mine
    # a wake only onto a device no model is awake on, and only for load already here
    host_of = {r.name: r.warm_host for r in replicas}
    for name in p.actions.wake:
        assert not by_claim[host_of[name]].awake_bytes, p.message
        assert p.output.decision.urgent, p.message
    # new sleepers' weights within each node's budget
    per_node = Counter(by_claim[r.warm_host].node for r in p.create if r.sleeping)
    weights = weight_bytes(svc.spec.model)
    assert all(n * weights <= budget_gib * GIB for n in per_node.values()), p.message


def test_the_policies_warm_pool_is_none_unless_stated_and_is_checked() -> None:
    shipped = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    assert parse_scaling_policy(shipped).warm_pool_gpus == 0
    assert parse_scaling_policy({**shipped, "warmPoolGPUs": 4}).warm_pool_gpus == 4
    for value, problem in ((-1, "must be greater than or equal to 0"), (2.5, "must be an integer"),
                           ("4", "must be an integer")):
        with pytest.raises(SpecError, match=rf"scaling.yaml: warmPoolGPUs.*{re.escape(problem)}"):
            parse_scaling_policy({**shipped, "warmPoolGPUs": value})


def test_a_sleeper_whose_pool_host_another_service_woke_on_is_kept_not_loaded_again() -> None:
    # b's one sleeper waits on the pool's host, where a's model woke first: it stays (host memory is all it costs,
    # and it wakes once a's sleeps again), within b's pool of one (no free GPU: the cluster is full)
    taken = WarmDevice("warm-a", "h100-0", H100, GPU, awake_bytes=GPU, sleepers=1)
    obs = replace(observe(exclusive(spec__scaling__prewarm__sleepingReplicas=1), ready("llm-r0"),
                          asleep("llm-r1", "warm-a"), rate=5.0), warm_hosts=pooled(taken, pool=1))
    p = plan(obs, held_warm(1))
    assert p.actions.remove == () and p.actions.create_sleeping == 0, p.message
    assert p.actions.wake == ()
