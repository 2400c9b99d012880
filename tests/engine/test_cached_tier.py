"""The cached tier in `plan_cycle` (spec.scaling.prewarm.nodeCache): over a rising rate with a 10-minute cold start,
the awake replicas cover only until a replica started on a node that holds the weights could serve, the nodes
holding them cover the rest; with no node holding them the shortfall stays awake and the plan asks for the
weights on the nodes with the most room; without the flag nothing changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from infer_ctl.decide.tiers import Tier
from infer_ctl.engine.cycle import CyclePlan, CycleState, plan_cycle
from tests.engine.test_cycle import CYCLE, T0, Snapshot, observe, ready, service, snapshot

PERIOD = 10.0


def ramp(t: float) -> float:
    """10 req/s rising to 80 over 40 minutes (the small cluster has 16 matching GPUs)."""
    return 10.0 + 70.0 * min(1.0, max(0.0, t - T0) / 2400.0)


def run(node_cache: bool, cluster: Callable[[], Snapshot], until_s: float = 1800.0, *,
        prefetching: frozenset[str] = frozenset(), backoff: frozenset[str] = frozenset(),
        node_cache_off: str = "") -> CyclePlan:
    svc = service(spec__scaling__prewarm__nodeCache=node_cache, spec__runtime__coldStartSeconds=600,
                  spec__scaling__maxReplicas=40, spec__scaling__targetRequestsPerReplica=10)
    state, n, plan = CycleState(), 1, None
    snap = cluster()
    for k in range(int(until_s / PERIOD)):
        now = T0 + k * PERIOD
        replicas = tuple(ready(f"llm-r{i}") for i in range(n))
        obs = observe(svc, *replicas, rate=ramp(now) * (1 + 0.05 * np.sin(k)), now=now, cluster=snap)
        obs = replace(obs, prefetching=prefetching, prefetch_backoff=backoff, node_cache_off=node_cache_off)
        plan, state = plan_cycle(obs, state, CYCLE, now)
        n = plan.serving + plan.standby
    assert plan is not None
    return plan


def cached_on(*nodes: str) -> Callable[[], Snapshot]:
    def make() -> Snapshot:
        snap = snapshot()
        key = service().spec.model.cache_key
        snap.cached = {node: frozenset({key}) for node in nodes}
        return snap
    return make


def test_nodes_holding_the_weights_cover_the_cold_start_and_fewer_replicas_are_awake() -> None:
    plain = run(False, snapshot)
    cached = run(True, cached_on("h100-0", "h100-1"))
    assert plain.output.tiers is None
    tiers = cached.output.tiers
    assert tiers is not None and dict(tiers.horizons_s)[Tier.STANDBY] == 0.25 * 600 + PERIOD
    assert tiers.cached > 0 and not tiers.passed_up, tiers
    assert cached.serving + cached.standby < plain.serving + plain.standby, (cached.message, plain.message)
    assert "from node caches" in cached.message and cached.prefetch == ()


def test_with_no_node_holding_the_weights_the_need_stays_awake_and_the_plan_prefetches() -> None:
    plain = run(False, snapshot)
    none = run(True, snapshot)
    tiers = none.output.tiers
    assert tiers is not None and tiers.cached == 0 and tiers.passed_up, tiers
    assert none.serving + none.standby >= plain.serving + plain.standby - 1
    # the nodes with the most free matching GPUs first (the two 8-GPU H100 nodes), as many as the shortfall needs
    assert none.prefetch and set(none.prefetch) <= {"h100-0", "h100-1"}, none.prefetch
    # a copy under way is not asked for again
    again = run(True, snapshot, prefetching=frozenset(none.prefetch))
    assert not set(again.prefetch) & set(none.prefetch)
    # nor a node whose copy failed within its backoff (here the only one with room: the other H100 node holds
    # the service's replicas), while the cached tier stays short
    assert none.prefetch == ("h100-0",)
    backed_off = run(True, snapshot, backoff=frozenset({"h100-0"}))
    assert backed_off.prefetch == () and backed_off.output.tiers is not None and backed_off.output.tiers.passed_up


def test_replicas_that_cannot_mount_the_node_cache_get_no_cached_tier_and_no_copies() -> None:
    # e.g. the namespace's Pod Security level refuses the cache's hostPath: a replica would load from the network
    # on a node that holds the weights, so the nodes holding them give no room, and no copy is asked for
    refused = 'namespace team-a refuses hostPath volumes (violates PodSecurity "baseline:latest")'
    for cluster in (cached_on("h100-0", "h100-1"), snapshot):
        plan = run(True, cluster, node_cache_off=refused)
        assert plan.output.tiers is None or Tier.CACHED not in dict(plan.output.tiers.horizons_s), plan.output.tiers
        assert plan.prefetch == ()
        assert f"no cached tier: {refused}" in plan.message, plan.message
        plain = run(False, cluster)
        assert plan.serving + plan.standby == plain.serving + plain.standby
