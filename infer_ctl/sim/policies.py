"""Autoscaling policies as the simulator runs them: the peers' algorithms, re-implemented from their sources
with their documented defaults (`infer_ctl.sim.hpa`, `infer_ctl.sim.peers`), and here an oracle, infer-ctl itself
(through the same engine the controller uses) and the single-tier products (`SleepingPool`, `NodeCached`).

Every policy is `decide(obs, state) -> (desired_replicas, state)` over a frozen state, called every
`period_s` of simulated time (rounded up to the simulator's tick), and declares the metric pipeline it reads
(`Pipeline`): a Prometheus `rate()` over scraped counters, or a direct scrape of the replicas averaged over a
window. Each policy is given the same notion of per-replica capacity, set the way its users are told to set it:
the target is the service's capacity at the SLO (`target_rps_per_replica`, C), or for Ray Serve the equivalent
number of ongoing requests (Little's law at load C). No baseline parameter is tuned: where a peer documents a
default, that default is used, and the docstrings say where it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from infer_ctl.core.api import InferenceService
from infer_ctl.core.policy import effective_scaling
from infer_ctl.core.promql import range_window_s
from infer_ctl.core.runtime import rate_query
from infer_ctl.engine.burst import BurstBasis, burst_basis
from infer_ctl.engine.cycle import (
    CyclePlan,
    CyclePolicies,
    CycleState,
    ObservedReplica,
    plan_cycle,
    service_policy,
)
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import Observation, Pipeline, SimPolicy
from infer_ctl.sim.hpa import Hpa, HpaState

# --- the oracle --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Oracle:
    """Knows every future arrival. Needs n*(t) = ceil(lam(t) / C) ready replicas in each tick (at load C a
    replica keeps 99 % of requests within the SLO), and starts each one `lead_s` ahead (the cold start's
    p90), so it holds max n* over [t, t + lead_s]; that also keeps a replica through any gap shorter than a cold
    start, when restarting would cost more GPU time than waiting. The lower reference for GPU-hours at the SLO
    given cold starts (it is not exact: a cold start slower than its p90 still makes it late)."""

    desired: FloatArray  # per tick, precomputed by `oracle_schedule`
    tick_s: float
    name: str = "oracle"

    @property
    def period_s(self) -> float:
        return self.tick_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return ()

    def initial_state(self) -> None:
        return None

    def decide(self, obs: Observation, state: None) -> tuple[int, None]:
        i = min(self.desired.size - 1, round(obs.now_s / self.tick_s))
        return int(self.desired[i]), None


def oracle_schedule(
    arrivals: FloatArray, tick_s: float, capacity_rps: float, lead_s: float, *, min_replicas: int, max_replicas: int
) -> FloatArray:
    need = np.maximum(np.ceil(arrivals / (capacity_rps * tick_s) - 1e-9), 0.0)
    k = max(1, math.ceil(lead_s / tick_s)) + 1
    padded = np.concatenate([need, np.zeros(k - 1)])
    ahead = np.lib.stride_tricks.sliding_window_view(padded, k).max(axis=1)
    return np.asarray(np.clip(ahead, min_replicas, max_replicas), dtype=np.float64)


# --- infer-ctl ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferCtl:
    """infer-ctl itself: the controller's `plan_cycle` (`infer_ctl.engine.cycle`) over the service's spec, with the
    controller's spec -> policy function, fed the way the controller is fed: the spec's metric query (by default
    `rate(infer_ctl_requests_total[1m])`) through Prometheus scraping every 15 s, its replicas by name and state
    (their cold starts measured from creation to ready), and nothing placed (the simulator has no cluster). Its
    plan names the replicas to create, promote, demote and remove; the simulator applies it as the controller
    would (`simulate`), standby replicas held out of traffic."""

    service: InferenceService
    policies: CyclePolicies
    metric_scrape_s: float = 15.0
    name: str = "infer-ctl"

    @property
    def period_s(self) -> float:
        return self.policies.period_s

    @property
    def metric_window_s(self) -> float:
        return range_window_s(rate_query(self.service.spec, self.policies.policies.runtimes)) or self.period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("prometheus", self.metric_window_s, self.metric_scrape_s),)

    def initial_state(self) -> tuple[CycleState, CyclePlan | None]:
        return CycleState(), None

    def observation(self, now_s: float, metric_rps: float, replicas: tuple[ObservedReplica, ...]) -> CycleObservation:
        return CycleObservation(self.service, replicas, spec_hash="", samples=((now_s, metric_rps),))

    def plan(
        self, observation: CycleObservation, now_s: float, state: tuple[CycleState, CyclePlan | None]
    ) -> tuple[CyclePlan, tuple[CycleState, CyclePlan | None]]:
        plan, cycle_state = plan_cycle(observation, state[0], self.policies, now_s)
        return plan, (cycle_state, plan)

    def burst_check_ticks(self, tick_s: float) -> int:
        """Every how many ticks of `tick_s` the simulator runs the controller's check between two cycles
        (`burstCheckSeconds`): at least one, so a cadence below the tick is checked once a tick."""
        return max(1, round(self.policies.policies.scaling.burst_check_s / tick_s))

    def burst_basis(self, plan: CyclePlan, in_flight: float) -> BurstBasis | None:
        """What the checks after a cycle that planned `plan` on the reading `in_flight` compare with, as the
        controller keeps it (`infer_ctl.engine.burst`)."""
        return burst_basis(self.service.spec, self.policies, wanted=plan.serving, in_flight=in_flight)

    @property
    def adaptive(self) -> bool:
        """Its aim moves from the attainment it measures (`infer_ctl.engine.aim`): the simulator then gives it one."""
        return bool(service_policy(self.service.spec, self.policies).aim_rungs)

    @property
    def attainment_window_s(self) -> float:
        return self.policies.policies.scaling.attainment_window_s

    @property
    def sleeping_tier(self) -> bool:
        """The spec lets it hold replicas asleep on warm hosts (`spec.scaling.prewarm.sleep`, else its preset's)."""
        return effective_scaling(self.service.spec.scaling, self.policies.policies.scaling).sleep

    @property
    def node_cache(self) -> bool:
        """The spec keeps its weights on the nodes' disks (`spec.scaling.prewarm.nodeCache`, else its preset's)."""
        return effective_scaling(self.service.spec.scaling, self.policies.policies.scaling).node_cache

    def decide(self, obs: Observation, state: Any) -> tuple[int, Any]:
        raise TypeError("infer-ctl plans replicas by name: the simulator calls InferCtl.plan")


# --- the single-tier products ------------------------------------------------------------------------------------
#
# Each does one warm tier alone, with a peer's autoscaler above it; the simulator (`infer_ctl.sim.fleet`, which
# `infer_ctl.sim.run.simulate` runs them on) applies the tier: `tier_use(policy)` says which.


@dataclass(frozen=True, slots=True)
class _ScaledByHpa:
    """A single-tier baseline whose scaling is an HPA's (`inner`): what differs is where its replicas start."""

    inner: Hpa

    @property
    def period_s(self) -> float:
        return self.inner.period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return self.inner.pipelines

    def initial_state(self) -> HpaState:
        return self.inner.initial_state()

    def decide(self, obs: Observation, state: HpaState) -> tuple[int, HpaState]:
        return self.inner.decide(obs, state)


@dataclass(frozen=True, slots=True)
class SleepingPool(_ScaledByHpa):
    """A fixed pool of sleeping replicas, woken on demand, under an HPA: what llm-d's fast model actuation (FMA)
    offers.

    - FMA (llm-d-incubation/llm-d-fast-model-actuation, README): "vLLM level 1 sleep and wake_up. A vLLM instance
      in level 1 sleep has its model tensors in main (CPU) memory rather than accelerator (GPU) memory ... waking
      up the sleeping instance is very fast; for example, taking about 3 seconds for a model with 64 GiB of
      tensor data"; its dual-pods design keeps server-providing Pods (holding the GPUs, running sleeping vLLM
      instances) apart from the server-requesting Pods a Deployment and its HPA scale, which are bound to a
      sleeping instance and wake it. vLLM's own docs (docs.vllm.ai, "Sleep Mode"): "Level 1 sleep will offload
      the model weights and discard the KV cache ... The model weights are backed up in CPU memory". (Issue 18
      names AIBrix's ModelClaim for the same idea; no documentation of its behaviour was found to port, so this
      baseline follows FMA's.)
    - Here: `pool` replicas of the service always sit on warm hosts (asleep, or awake while the HPA's count needs
      them); the HPA (`inner`, as ported in this module, its defaults) scales the count; a scale-up wakes pool
      replicas first (those whose warm host's GPU is free), in the wake time, and starts cold replicas for the
      rest; a scale-down puts pool replicas back to sleep first, then removes the others (newest first). The pool
      is created asleep before the trace starts, like the initial replicas. Its size is the operator's: a fixed
      number, not forecast.
    """

    pool: int = 2
    name: str = "fma-pool"

    def __post_init__(self) -> None:
        if self.pool < 1:
            raise ValueError(f"pool: {self.pool} must be at least 1")


@dataclass(frozen=True, slots=True)
class NodeCached(_ScaledByHpa):
    """A node model cache under an HPA: KServe's LocalModelCache.

    - KServe (kserve.github.io, "KServe Local Model Cache"): "By caching LLM models locally, the InferenceService
      startup time can be greatly improved"; a LocalModelCache names a model to download to the local disks of a
      LocalModelNodeGroup's nodes, ahead of any replica, and replicas scheduled there mount it. KServe's Standard
      deployment mode, the one its docs recommend for LLM serving, scales an InferenceService with Kubernetes'
      HPA (kserve.github.io, "Autoscaling with Kubernetes HPA"; no scale to zero in that mode).
    - Here: every node holds the model's weights, so every start is a cached start (`ServiceModel.cached_factor`
      of the cold start); the HPA (`inner`) scales as it does alone. The disks are not charged.
    """

    name: str = "kserve-cache"


@dataclass(frozen=True, slots=True)
class TierUse:
    """The warm tiers a policy uses in the simulator: replicas kept on warm hosts (`pool`, a fixed number; or
    `sleeping` for infer-ctl's own), and every start from a node cache (`node_cache`)."""

    pool: int = 0
    sleeping: bool = False
    node_cache: bool = False

    @property
    def any(self) -> bool:
        return bool(self.pool or self.sleeping or self.node_cache)


def tier_use(policy: SimPolicy | InferCtl) -> TierUse:
    if isinstance(policy, InferCtl):
        return TierUse(sleeping=policy.sleeping_tier, node_cache=policy.node_cache)
    if isinstance(policy, SleepingPool):
        return TierUse(pool=policy.pool)
    if isinstance(policy, NodeCached):
        return TierUse(node_cache=True)
    return TierUse()


def forecast_probe(state: Any) -> float:
    plan = state[1] if isinstance(state, tuple) and len(state) == 2 else None
    fc = getattr(getattr(plan, "output", None), "forecast", None)
    if fc is None:
        return math.nan
    return float(fc.upper_rps[0])
