"""The shared tick physics of both simulation loops (`infer_ctl.sim.single`, `infer_ctl.sim.fleet`): the
configuration and result of a run, the arrivals per tick, the metric pipelines, the replicas by name and state,
the fluid queue, the latency model and its scores, infer-ctl's reading of the requests in flight and its measured
SLO attainment."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infer_ctl.core.api import ReplicaState
from infer_ctl.core.slo import Attainment, SloWindow
from infer_ctl.engine.burst import BurstBasis, burst_due
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.engine.cycle import (
    ObservedReplica,
)
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import Pipeline, SimPolicy
from infer_ctl.sim.model import ServiceModel, prometheus_rate, window_rate
from infer_ctl.sim.policies import InferCtl
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
    # host memory its sleepers' weights held (the fleet simulator's warm hosts), and wakes refused for want of a
    # free GPU on the sleeper's warm host
    host_memory_gib_hours: float = 0.0
    wake_refused: int = 0
    # infer-ctl's cycles run between two periods by its check of the requests in flight (`infer_ctl.engine.burst`)
    burst_cycles: int = 0

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


def pipeline_values(p: Pipeline, arrivals: FloatArray, tick_s: float) -> FloatArray:
    if p.kind == "prometheus":
        return np.asarray(prometheus_rate(arrivals, tick_s, p.scrape_s, p.window_s), dtype=np.float64)
    if p.kind == "direct":
        return np.asarray(window_rate(arrivals, tick_s, p.window_s), dtype=np.float64)
    raise ValueError(f"unknown metric pipeline {p.kind!r}")


class Replicas:
    """One service's simulated replicas, by name in creation order (as the observation lists them): loading ones
    by ready time; ready ones serving or standby (standby replicas are warm but out of traffic, as the
    controller's router keeps them). A count policy's replicas all serve; infer-ctl's are tracked by name, as its
    plan names them. The fleet simulator's replicas (`infer_ctl.sim.fleet`) are these, with Pending Pods, nodes
    and the sleeping tier added.

    What a replica becomes when its load is over: serving or standby by its label; asleep when it was made to
    sleep (`to_sleep`: its load went to a warm host, then the model server slept); serving again, with its cold
    start unchanged, when it was woken (`waking`: a wake is not a cold start)."""

    def __init__(self, product: str) -> None:
        self.product = product
        self.loading: list[tuple[float, str]] = []  # (ready-at time, name), sorted
        self.replicas: dict[str, ObservedReplica] = {}
        self.serving = 0  # ready serving replicas: the capacity
        self.cold_starts = 0
        self.to_sleep: set[str] = set()
        self.waking: set[str] = set()
        self._ordinal = 0

    def new_name(self) -> str:
        self._ordinal += 1
        return f"sim-{self._ordinal}"

    @property
    def alive(self) -> int:
        return len(self.replicas)

    def advance(self, now: float) -> None:
        """Replicas whose load (or wake) is over become ready, or asleep (a cold start measured at the tick that
        sees it)."""
        while self.loading and self.loading[0][0] <= now:
            _, name = self.loading.pop(0)
            r = self.replicas[name]
            if name in self.waking:
                self.waking.discard(name)
                self.replicas[name] = replace(r, state=ReplicaState.SERVING, standby=False)
                self.serving += 1
                continue
            cold = now - (r.created_s or 0.0)
            if name in self.to_sleep:
                self.to_sleep.discard(name)
                self.replicas[name] = replace(r, state=ReplicaState.SLEEPING, cold_start_s=cold)
                continue
            self.replicas[name] = replace(r, state=ReplicaState.STANDBY if r.standby else ReplicaState.SERVING,
                                          cold_start_s=cold)
            self.serving += not r.standby

    def set_role(self, name: str, standby: bool) -> None:
        r = self.replicas[name]
        if r.standby == standby:
            return
        ready = r.state in (ReplicaState.SERVING, ReplicaState.STANDBY)
        state = (ReplicaState.STANDBY if standby else ReplicaState.SERVING) if ready else r.state
        self.replicas[name] = replace(r, standby=standby, state=state)
        if ready:
            self.serving += -1 if standby else 1

    def forget(self, name: str) -> ObservedReplica:
        """Drop one replica from the books (and from the loading queue); the state it was in is returned."""
        r = self.replicas.pop(name)
        if r.state is ReplicaState.LOADING:
            self.loading = [x for x in self.loading if x[1] != name]
            self.to_sleep.discard(name)
            self.waking.discard(name)
        self.serving -= r.state is ReplicaState.SERVING
        return r


def queue_step(q: float, arrived: float, ready: int, dt: float, model: ServiceModel) -> tuple[float, float]:
    """One tick of the fluid queue: the backlog after `arrived` requests met `ready` replicas' capacity (requests
    older than the timeout dropped), and the requests in flight (Little's law, plus the backlog beyond a tick)."""
    if ready <= 0:
        return q + arrived, q + arrived
    mu = model.service_rate_rps
    cap = ready * mu * dt
    lam = arrived / (ready * dt)
    ongoing = (arrived / dt) * (model.base_latency_s + q / (ready * mu) + 1.0 / max(mu - lam, 0.02 * mu)) + max(
        0.0, q - cap)
    return min(max(0.0, q + arrived - cap), model.request_timeout_s * mu * ready), ongoing


def burst_cycle_due(policy: InferCtl, basis: BurstBasis | None, model: ServiceModel, t: int, dt: float, *,
                    period_ticks: int, check_ticks: int, arrivals: FloatArray, ready_n: np.ndarray[Any, Any],
                    backlog: FloatArray, window_s: float, serving: int) -> bool:
    """Whether infer-ctl's check between two cycles (`infer_ctl.engine.burst`, the controller's burst-check timer)
    runs its cycle at tick `t`: a tick between two periods that the check's cadence falls on (`check_ticks`: its
    `burstCheckSeconds` in ticks, at least one: a cadence below the tick is checked once a tick), after a cycle
    that left a basis, whose reading of the requests in flight (`in_flight_seen`, as Prometheus last scraped
    them) calls for one."""
    if basis is None or t % period_ticks == 0 or t % check_ticks:
        return False
    reading = in_flight_seen(policy, model, t, dt, arrivals=arrivals, ready_n=ready_n, backlog=backlog,
                             window_s=window_s)
    return bool(burst_due(basis, in_flight=reading, serving=serving))


def in_flight_seen(policy: InferCtl, model: ServiceModel, t: int, dt: float, *, arrivals: FloatArray,
                    ready_n: np.ndarray[Any, Any], backlog: FloatArray, window_s: float) -> float:
    """The requests in flight infer-ctl reads at tick `t`: the gauges as Prometheus last scraped them (every
    `metric_scrape_s`), the model's in-flight requests at the start of that tick (`ServiceModel.in_flight`: its
    backlog, and what its ready replicas hold at the arrival rate of the `window_s` before: a replica's own queue
    follows its load over tens of seconds, not one tick's Poisson count)."""
    scraped = min(t, math.floor(math.floor(t * dt / policy.metric_scrape_s + 1e-9) * policy.metric_scrape_s / dt
                                + 1e-9))
    if scraped <= 0:
        return math.nan  # nothing scraped yet
    k = max(1, round(window_s / dt))
    recent = arrivals[max(0, scraped - k):scraped]
    return model.in_flight(int(ready_n[scraped]), float(recent.mean()) / dt, float(backlog[scraped]))


def _tick_latency(arrivals: FloatArray, ready_n: np.ndarray[Any, Any], backlog: FloatArray, model: ServiceModel,
                  dt: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Each tick's latency distribution (base + wait, then exponential at rate nu: `shift`, `nu`) and the share
    of its requests within the SLO. A tick with no replica ready waits for the next tick that has one (within the
    arrays: beyond their end, for ever)."""
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
    slack = np.maximum(model.slo_latency_s - shift, 0.0)
    within = np.where(shift < model.slo_latency_s, 1.0 - np.exp(-nu * slack), 0.0)
    within = np.where(shift > model.request_timeout_s, 0.0, within)
    return shift, nu, within


@dataclass
class MeasuredSlo:
    """The attainment infer-ctl is given, as the controller reads status.slo (`infer_ctl.core.slo`): the share of
    requests within the SLO over the trailing `window_s`, from the ticks since the last measure, every
    `every_s` (Prometheus' buckets are read once a cycle; a minute's resolution moves nothing an hour's window
    decides on). Requests of a tick whose wait runs past the ticks measured (no replica ready yet) count as late."""

    window_s: float
    enabled: bool = True  # only for a policy whose aim moves on it (the measure costs simulator time)
    every_s: float = 60.0
    window: SloWindow = field(default_factory=SloWindow)
    upto: int = 0  # the first tick not measured yet

    @staticmethod
    def of(policy: SimPolicy | InferCtl) -> MeasuredSlo:
        if isinstance(policy, InferCtl):
            return MeasuredSlo(policy.attainment_window_s, policy.adaptive)
        return MeasuredSlo(3600.0, enabled=False)

    def attach(self, observation: CycleObservation, t: int, *, dt: float, arrivals: FloatArray,
               ready_n: np.ndarray[Any, Any], backlog: FloatArray, model: ServiceModel) -> CycleObservation:
        """The observation with the attainment measured up to tick `t` (unchanged when not enabled)."""
        if not self.enabled:
            return observation
        return replace(observation, attainment=self.at(t, dt=dt, arrivals=arrivals, ready_n=ready_n,
                                                       backlog=backlog, model=model))

    def at(self, t: int, *, dt: float, arrivals: FloatArray, ready_n: np.ndarray[Any, Any], backlog: FloatArray,
           model: ServiceModel) -> Attainment:
        if (t - self.upto) * dt >= self.every_s:
            a = arrivals[self.upto:t]
            _, _, within = _tick_latency(a, ready_n[self.upto:t], backlog[self.upto:t], model, dt)
            self.window = self.window.add(t * dt, float((a * within).sum()), float(a.sum()), self.window_s)
            self.upto = t
        return self.window.attainment(t * dt, self.window_s)


def latency_stats(
    arrivals: FloatArray, ready_n: np.ndarray[Any, Any], backlog: FloatArray, model: ServiceModel, dt: float
) -> tuple[float, float, float]:
    """SLO attainment and p95/p99 over all requests, from each tick's latency distribution."""
    total = float(arrivals.sum())
    if total == 0:
        return 1.0, 0.0, 0.0
    shift, nu, within = _tick_latency(arrivals, ready_n, backlog, model, dt)
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
