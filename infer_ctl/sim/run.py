"""The simulation loop: one policy over one trace in simulated time.

Per tick (`tick_s`): replicas whose cold start is over become ready; the tick's arrivals are served by the
ready replicas (the fleet backlog grows when they cannot keep up); every `period_s` the policy decides, and the
simulator creates replicas (with a sampled cold start, shorter on a node that still caches the model) or
removes them in the ReplicaSet controller's order (loading pods first, newest first). The per-tick work is a
few integer operations in Python; everything per request (latency distributions, percentiles, the SLO
attainment) is computed afterwards with numpy over the per-tick arrays, so there are no per-request objects.

Every ready replica takes traffic: infer-ctl's standby replicas are warm and become serving by a label change
within a control period, which the simulator does not model separately (its `serving/standby` split matters to
routing and to batch gangs, not to how many GPUs are held).

The start. Every policy, the oracle included, starts with the same `initial_replicas`, ready, and no history
(`infer_ctl.sim.suite.initial_replicas`: by default a service already running when the trace starts, sized for the
traffic of the first cold start at the SLO capacity, which is what the oracle would hold at t = 0). A real
service is running when a trace begins; starting it with too few replicas would score every policy on the first
cold start, which none but a clairvoyant can serve.

Latency per tick (the model in `infer_ctl.sim.model`): with n ready replicas, per-replica load lam = A/(n*dt),
backlog Q at the start of the tick, a request's latency is base + W + Exp(nu) with W = Q/(n*mu) and
nu = max(mu - lam, 0.02 mu); with no ready replica, W is the time until the first one is ready.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.model import ServiceModel, prometheus_rate, window_rate
from infer_ctl.sim.policies import Observation, Pipeline, SimPolicy
from infer_ctl.sim.trace import Trace


@dataclass(frozen=True, slots=True)
class SimConfig:
    tick_s: float = 1.0
    seed: int = 0
    ongoing_window_s: float = 30.0
    # score from this time on: requests and GPU-hours before it are left out (a warm-up, when no policy has
    # history yet); the policies run from the start either way
    score_from_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    slo_attainment: float
    gpu_hours: float
    cold_starts: int
    p95_latency_ms: float
    p99_latency_ms: float
    scale_events: int
    wall_s: float
    requests: float
    # per-tick series, for plots
    times_s: FloatArray = field(repr=False)
    arrivals_rps: FloatArray = field(repr=False)
    desired: FloatArray = field(repr=False)
    ready: FloatArray = field(repr=False)
    alive: FloatArray = field(repr=False)
    forecast_upper_rps: FloatArray = field(repr=False)

    def row(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "slo_attainment": round(self.slo_attainment, 6),
            "gpu_hours": round(self.gpu_hours, 3),
            "cold_starts": self.cold_starts,
            "p95_latency_ms": round(self.p95_latency_ms, 1),
            "p99_latency_ms": round(self.p99_latency_ms, 1),
            "scale_events": self.scale_events,
            "wall_s": round(self.wall_s, 3),
        }


def arrivals_per_tick(trace: Trace, tick_s: float, rate_scale: float, rng: np.random.Generator) -> FloatArray:
    """Arrivals per simulator tick. Buckets wider than a tick are spread over their ticks as Poisson arrivals
    (so a 5-minute count becomes a realistic per-tick sequence); narrower buckets are summed. With a rate scale,
    each tick's count is redrawn as Poisson(scale x count), which keeps the trace's burstiness."""
    if trace.bucket_s >= tick_s:
        per = round(trace.bucket_s / tick_s)
        if abs(per * tick_s - trace.bucket_s) > 1e-6:
            raise ValueError(f"the trace's bucket ({trace.bucket_s} s) is not a multiple of the tick ({tick_s} s)")
        expected = np.repeat(trace.counts * rate_scale / per, per)
        if per == 1 and rate_scale == 1.0:
            return expected.astype(np.float64)
        return rng.poisson(expected).astype(np.float64)
    per = round(tick_s / trace.bucket_s)
    n = trace.counts.size // per * per
    summed: FloatArray = np.asarray(trace.counts[:n].reshape(-1, per).sum(axis=1), dtype=np.float64)
    if rate_scale == 1.0:
        return summed
    return rng.poisson(summed * rate_scale).astype(np.float64)


def _pipeline_values(p: Pipeline, arrivals: FloatArray, tick_s: float) -> FloatArray:
    if p.kind == "prometheus":
        return np.asarray(prometheus_rate(arrivals, tick_s, p.scrape_s, p.window_s), dtype=np.float64)
    if p.kind == "direct":
        return np.asarray(window_rate(arrivals, tick_s, p.window_s), dtype=np.float64)
    raise ValueError(f"unknown metric pipeline {p.kind!r}")


def simulate(
    trace_arrivals: FloatArray,
    policy: SimPolicy,
    model: ServiceModel,
    config: SimConfig,
    *,
    initial_replicas: int = 1,
    progress: Callable[[float], None] | None = None,
    forecast_probe: Callable[[Any], float] | None = None,
) -> SimResult:
    """Run `policy` over the arrivals (per tick). `forecast_probe(state)` extracts a forecast upper rate from
    the policy state for plotting (infer-ctl)."""
    wall0 = time.perf_counter()
    dt = config.tick_s
    arrivals = trace_arrivals
    n_ticks = arrivals.size
    rng = np.random.default_rng(config.seed)
    mu = model.service_rate_rps
    metrics = [_pipeline_values(p, arrivals, dt) for p in policy.pipelines]
    metric_a = metrics[0] if metrics else np.full(n_ticks, np.nan)
    metric_b = metrics[1] if len(metrics) > 1 else np.full(n_ticks, np.nan)
    period_ticks = max(1, round(policy.period_s / dt))
    ongoing_k = max(1, round(config.ongoing_window_s / dt))

    ready_n = np.zeros(n_ticks, dtype=np.int64)
    alive_n = np.zeros(n_ticks, dtype=np.int64)
    desired_n = np.zeros(n_ticks, dtype=np.int64)
    backlog = np.zeros(n_ticks)
    fc_upper = np.full(n_ticks, np.nan)

    loading: list[float] = []  # ready-at times, sorted
    ready = initial_replicas
    q = 0.0
    cache: deque[float] = deque()  # deletion times of replicas whose node still caches the model
    cold_samples: deque[float] = deque(maxlen=50)
    cold_starts = 0
    scale_events = 0
    state = policy.initial_state()
    ongoing_ring = [0.0] * ongoing_k
    ongoing_sum = 0.0
    desired = initial_replicas
    report_every = max(1, n_ticks // 100)
    p90, p90_dirty = math.nan, False
    timeout_backlog = model.request_timeout_s * mu

    for t in range(n_ticks):
        now = t * dt
        while loading and loading[0] <= now:
            loading.pop(0)
            ready += 1
        a = float(arrivals[t])
        backlog[t] = q
        ready_n[t] = ready
        if ready > 0:
            cap = ready * mu * dt
            lam = a / (ready * dt)
            ongoing_now = (a / dt) * (model.base_latency_s + q / (ready * mu) + 1.0 / max(mu - lam, 0.02 * mu)) + max(
                0.0, q - cap
            )
            q = min(max(0.0, q + a - cap), timeout_backlog * ready)
        else:
            q += a
            ongoing_now = q
        ongoing_sum += ongoing_now - ongoing_ring[t % ongoing_k]
        ongoing_ring[t % ongoing_k] = ongoing_now
        if t % period_ticks == 0:
            if p90_dirty:
                p90 = float(np.quantile(np.asarray(cold_samples), 0.9)) if len(cold_samples) >= 3 else math.nan
                p90_dirty = False
            obs = Observation(
                now_s=now,
                ready=ready,
                loading=len(loading),
                metric_rps=float(metric_a[t - 1]) if t > 0 else math.nan,
                panic_rps=float(metric_b[t - 1]) if t > 0 else math.nan,
                ongoing=ongoing_sum / ongoing_k,
                waiting=q if ready == 0 else 0.0,
                cold_start_p90_s=p90,
            )
            new_desired, state = policy.decide(obs, state)
            if forecast_probe is not None:
                fc_upper[t] = forecast_probe(state)
            total = ready + len(loading)
            if new_desired != total:
                scale_events += 1
            while cache and cache[0] < now - model.cache_ttl_s:
                cache.popleft()
            if new_desired > total:
                for _ in range(new_desired - total):
                    cached = bool(cache)
                    if cached:
                        cache.pop()
                    cs = model.sample_cold_start_s(rng, cached)
                    cold_samples.append(cs)
                    p90_dirty = True
                    bisect.insort(loading, now + cs)
                    cold_starts += 1
            elif new_desired < total:
                remove = total - new_desired
                while remove and loading:
                    loading.pop()  # the newest loading pod first (ReplicaSet deletion order)
                    remove -= 1
                ready -= remove
                cache.extend([now] * remove)
            desired = new_desired
        desired_n[t] = desired
        alive_n[t] = ready + len(loading)
        if progress is not None and t % report_every == 0:
            progress(t / n_ticks)
    if progress is not None:
        progress(1.0)

    w = min(n_ticks, max(0, math.ceil(config.score_from_s / dt)))
    scored = np.concatenate([np.zeros(w), arrivals[w:]])
    attainment, p95, p99 = _latency_stats(scored, ready_n, backlog, model, dt)
    gpu_hours = float(alive_n[w:].sum()) * dt * model.gpus_per_replica / 3600.0
    times = np.arange(n_ticks, dtype=np.float64) * dt
    return SimResult(
        policy=policy.name,
        slo_attainment=attainment,
        gpu_hours=gpu_hours,
        cold_starts=cold_starts,
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
    )


def _latency_stats(
    arrivals: FloatArray, ready_n: np.ndarray[Any, Any], backlog: FloatArray, model: ServiceModel, dt: float
) -> tuple[float, float, float]:
    """SLO attainment and p95/p99 over all requests, from each tick's latency distribution."""
    n = arrivals.size
    mu = model.service_rate_rps
    # time until a replica is ready, for ticks with none: index of the next tick with ready > 0
    idx = np.where(ready_n > 0, np.arange(n), n)
    nxt = np.minimum.accumulate(idx[::-1])[::-1]
    wait_none = np.where(nxt < n, (nxt - np.arange(n)) * dt, np.inf) + 0.5 * dt
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = arrivals / (np.maximum(ready_n, 1) * dt)
        w = np.where(ready_n > 0, backlog / (np.maximum(ready_n, 1) * mu), wait_none)
    nu = np.where(ready_n > 0, np.maximum(mu - lam, 0.02 * mu), mu)
    shift = model.base_latency_s + w
    total = float(arrivals.sum())
    if total == 0:
        return 1.0, 0.0, 0.0
    slack = np.maximum(model.slo_latency_s - shift, 0.0)
    within = np.where(shift < model.slo_latency_s, 1.0 - np.exp(-nu * slack), 0.0)
    within = np.where(shift > model.request_timeout_s, 0.0, within)
    attainment = float((arrivals * within).sum() / total)
    weights = arrivals / total

    def below(x: float) -> float:
        """The fraction of all requests with latency <= x (the arrival-weighted mixture of the ticks' CDFs)."""
        cdf = np.where(shift < x, 1.0 - np.exp(-nu * np.maximum(x - shift, 0.0)), 0.0)
        return float((weights * cdf).sum())

    def pct(p: float) -> float:
        # bisection in log latency between 1 ms and 10^5 s: 60 halvings of a 1e8 range is far below 1 ms
        lo, hi = math.log(1e-3), math.log(1e5)
        if below(math.exp(hi)) < p:
            return math.inf
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if below(math.exp(mid)) >= p:
                hi = mid
            else:
                lo = mid
        return math.exp(hi)

    return attainment, pct(0.95), pct(0.99)
