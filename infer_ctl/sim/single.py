"""The simulation loop: one policy over one trace in simulated time.

Per tick (`tick_s`): replicas whose cold start is over become ready; the tick's arrivals are served by the
ready replicas (the fleet backlog grows when they cannot keep up); every `period_s` the policy decides (infer-ctl
also between two periods when its check of the requests in flight calls for a cycle, as the controller's
burst-check timer does, on the ticks the check's cadence falls on: once a tick at most), and the simulator
creates replicas (with a sampled cold start, shorter on a node that still caches the model) or removes them in
the ReplicaSet controller's order (loading pods first, newest first). The per-tick work is a few integer
operations in Python; everything per request (latency distributions, percentiles, the SLO attainment) is computed
afterwards with numpy over the per-tick arrays, so there are no per-request objects.

Every ready replica takes traffic: infer-ctl's standby replicas are warm and become serving by a label change
within a control period, which the simulator does not model separately (its `serving/standby` split matters to
routing and to batch gangs, not to how many GPUs are held).

The start. Every policy, the oracle included, starts with the same `initial_replicas`, ready, and no history
(`infer_ctl.sim.catalogue.initial_replicas`: by default a service already running when the trace starts, sized for the
traffic of the first cold start at the SLO capacity, which is what the oracle would hold at t = 0). A real
service is running when a trace begins; starting it with too few replicas would score every policy on the first
cold start, which none but a clairvoyant can serve.

Latency per tick (the model in `infer_ctl.sim.model`): with n ready replicas, per-replica load lam = A/(n*dt),
backlog Q at the start of the tick, a request's latency is base + W + Exp(nu) with W = Q/(n*mu) and
nu = max(mu - lam, 0.02 mu); with no ready replica, W is the time until the first one is ready.
infer-ctl also reads the requests in flight (its burst guard's leading signal), as the controller reads the
router's and model servers' gauges through Prometheus: the backlog and the requests the ready replicas hold by the
same latency model, at the last scrape (`ServiceModel.in_flight`).

The warm tiers (sleepers on warm hosts, node caches) are modelled once, in the fleet simulator: `simulate` runs a
policy that uses one (`policies.tier_use`) there, alone on a cluster with room for all it could hold
(`infer_ctl.sim.fleet.simulate_alone`), so its warm hosts are charged and its host memory reported.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.burst import BurstBasis
from infer_ctl.engine.cycle import (
    CyclePlan,
    ObservedReplica,
)
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import Observation, SimPolicy
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import InferCtl
from infer_ctl.sim.tick import (
    MeasuredSlo,
    Replicas,
    SimConfig,
    SimResult,
    burst_cycle_due,
    in_flight_seen,
    latency_stats,
    pipeline_values,
    queue_step,
)


class _Fleet(Replicas):
    """The single-service simulator's replicas: created where the cluster has room (it has no limit)."""

    def __init__(self, initial: int, product: str) -> None:
        super().__init__(product)
        for _ in range(initial):
            name = self.new_name()
            self.replicas[name] = ObservedReplica(name, ReplicaState.SERVING, False, created_s=0.0,
                                                  accelerator=product)
            self.serving += 1

    def create(self, now: float, name: str | None, standby: bool, cold_start_s: float, cached: bool) -> None:
        name = name or self.new_name()
        # a replica started as standby runs at the standby's PriorityClass for its whole life (the controller's
        # Pods cannot change priority), promoted or not
        self.replicas[name] = ObservedReplica(name, ReplicaState.LOADING, standby, created_s=now,
                                              low_priority=standby, accelerator=self.product, cached=cached)
        bisect.insort(self.loading, (now + cold_start_s, name))
        self.cold_starts += 1

    def remove(self, name: str) -> bool:
        """Remove one replica; True when it was ready (its node then caches the model)."""
        return self.forget(name).state is not ReplicaState.LOADING

    def shrink(self, n: int) -> int:
        """A count policy's scale-down, in the ReplicaSet controller's order: loading Pods first, newest first,
        then ready ones (newest first). Returns how many ready replicas went."""
        ready_removed = 0
        while n and self.loading:
            self.remove(self.loading[-1][1])
            n -= 1
        for name in sorted(self.replicas, key=lambda k: self.replicas[k].created_s or 0.0, reverse=True)[:n]:
            ready_removed += self.remove(name)
        return ready_removed


def simulate_single(
    trace_arrivals: FloatArray,
    policy: SimPolicy | InferCtl,
    model: ServiceModel,
    config: SimConfig,
    *,
    initial_replicas: int,
    progress: Callable[[float], None] | None,
    forecast_probe: Callable[[Any], float] | None,
    on_cycle: Callable[[CycleObservation, CyclePlan], None] | None,
) -> SimResult:
    wall0 = time.perf_counter()
    dt = config.tick_s
    arrivals = trace_arrivals
    n_ticks = arrivals.size
    rng = np.random.default_rng(config.seed)
    metrics = [pipeline_values(p, arrivals, dt) for p in policy.pipelines]
    metric_a = metrics[0] if metrics else np.full(n_ticks, np.nan)
    metric_b = metrics[1] if len(metrics) > 1 else np.full(n_ticks, np.nan)
    period_ticks = max(1, round(policy.period_s / dt))
    check_ticks = policy.burst_check_ticks(dt) if isinstance(policy, InferCtl) else 1
    basis: BurstBasis | None = None
    burst_cycles = 0
    ongoing_k = max(1, round(config.ongoing_window_s / dt))

    ready_n = np.zeros(n_ticks, dtype=np.int64)
    alive_n = np.zeros(n_ticks, dtype=np.int64)
    desired_n = np.zeros(n_ticks, dtype=np.int64)
    backlog = np.zeros(n_ticks)
    fc_upper = np.full(n_ticks, np.nan)

    fleet = _Fleet(initial_replicas, model.accelerator)
    q = 0.0
    cache: deque[float] = deque()  # deletion times of replicas whose node still caches the model
    cold_samples: deque[float] = deque(maxlen=50)
    scale_events = 0
    state = policy.initial_state()
    ongoing_ring = [0.0] * ongoing_k
    ongoing_sum = 0.0
    desired = initial_replicas
    report_every = max(1, n_ticks // 100)
    p90, p90_dirty = math.nan, False
    measured = MeasuredSlo.of(policy)

    def start(now: float, name: str | None, standby: bool) -> None:
        nonlocal p90_dirty
        cached = bool(cache)
        if cached:
            cache.pop()
        cs = model.sample_cold_start_s(rng, cached)
        cold_samples.append(cs)
        p90_dirty = True
        fleet.create(now, name, standby, cs, cached)

    for t in range(n_ticks):
        now = t * dt
        fleet.advance(now)
        ready = fleet.serving
        a = float(arrivals[t])
        backlog[t] = q
        ready_n[t] = ready
        q, ongoing_now = queue_step(q, a, ready, dt, model)
        ongoing_sum += ongoing_now - ongoing_ring[t % ongoing_k]
        ongoing_ring[t % ongoing_k] = ongoing_now
        burst_now = isinstance(policy, InferCtl) and burst_cycle_due(
            policy, basis, model, t, dt, period_ticks=period_ticks, check_ticks=check_ticks, arrivals=arrivals,
            ready_n=ready_n, backlog=backlog, window_s=config.ongoing_window_s, serving=fleet.serving)
        burst_cycles += burst_now
        if t % period_ticks == 0 or burst_now:
            while cache and cache[0] < now - model.cache_ttl_s:
                cache.popleft()
            before = fleet.alive
            metric = float(metric_a[t - 1]) if t > 0 else math.nan
            if isinstance(policy, InferCtl):
                observation = replace(policy.observation(now, metric, tuple(fleet.replicas.values())),
                                      concurrency=in_flight_seen(policy, model, t, dt, arrivals=arrivals,
                                                                  ready_n=ready_n, backlog=backlog,
                                                                  window_s=config.ongoing_window_s))
                observation = measured.attach(observation, t, dt=dt, arrivals=arrivals, ready_n=ready_n,
                                              backlog=backlog, model=model)
                plan, state = policy.plan(observation, now, state)
                basis = policy.burst_basis(plan, observation.concurrency)
                if on_cycle is not None:
                    on_cycle(observation, plan)
                _apply(plan, fleet, cache, now, start)
                desired = plan.serving + plan.standby
            else:
                if p90_dirty:
                    p90 = float(np.quantile(np.asarray(cold_samples), 0.9)) if len(cold_samples) >= 3 else math.nan
                    p90_dirty = False
                obs = Observation(now_s=now, ready=ready, loading=len(fleet.loading), metric_rps=metric,
                                  panic_rps=float(metric_b[t - 1]) if t > 0 else math.nan,
                                  ongoing=ongoing_sum / ongoing_k, waiting=q if ready == 0 else 0.0,
                                  cold_start_p90_s=p90)
                desired, state = policy.decide(obs, state)
                if desired > fleet.alive:
                    for _ in range(desired - fleet.alive):
                        start(now, None, False)
                elif desired < fleet.alive:
                    cache.extend([now] * fleet.shrink(fleet.alive - desired))
            if forecast_probe is not None:
                fc_upper[t] = forecast_probe(state)
            scale_events += desired != before
        desired_n[t] = desired
        alive_n[t] = fleet.alive
        if progress is not None and t % report_every == 0:
            progress(t / n_ticks)
    if progress is not None:
        progress(1.0)

    w = min(n_ticks, max(0, math.ceil(config.score_from_s / dt)))
    scored = np.concatenate([np.zeros(w), arrivals[w:]])
    attainment, p95, p99 = latency_stats(scored, ready_n, backlog, model, dt)
    gpu_hours = float(alive_n[w:].sum()) * dt * model.gpus_per_replica / 3600.0
    times = np.arange(n_ticks, dtype=np.float64) * dt
    return SimResult(
        policy=policy.name,
        slo_attainment=attainment,
        gpu_hours=gpu_hours,
        cold_starts=fleet.cold_starts,
        p95_latency_ms=p95 * 1000.0,
        p99_latency_ms=p99 * 1000.0,
        scale_events=scale_events,
        wall_s=time.perf_counter() - wall0,
        requests=float(scored.sum()),
        times_s=times,
        arrivals_rps=arrivals / dt,
        desired=desired_n.astype(np.float64),
        ready=ready_n.astype(np.float64),
        alive=alive_n.astype(np.float64),
        forecast_upper_rps=fc_upper,
        burst_cycles=burst_cycles,
    )


def _apply(plan: CyclePlan, fleet: _Fleet, cache: deque[float], now: float,
           start: Callable[[float, str | None, bool], None]) -> None:
    """infer-ctl's plan, as the controller writes it: roles, removals (a removed ready replica leaves the model
    in its node's cache), then the new replicas under the names the plan gave them."""
    for name in plan.actions.promote:
        fleet.set_role(name, False)
    for name in plan.actions.demote:
        fleet.set_role(name, True)
    for name in plan.actions.remove:
        if fleet.remove(name):
            cache.append(now)
    for replica in plan.create:
        start(now, replica.name, replica.standby)
