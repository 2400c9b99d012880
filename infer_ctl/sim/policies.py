"""Autoscaling policies as the simulator runs them: the peers' algorithms, re-implemented from their sources
with their documented defaults, an oracle, and infer-ctl itself (through the same engine the controller uses).

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
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from infer_ctl.core.api import InferenceService
from infer_ctl.core.promql import range_window_s
from infer_ctl.engine.cycle import CyclePlan, CyclePolicies, CycleState, ObservedReplica, plan_cycle
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.forecast.series import FloatArray


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How a policy sees the request rate: `prometheus` (rate over counters scraped every `scrape_s`) or
    `direct` (a per-second scrape averaged over `window_s`)."""

    kind: str
    window_s: float
    scrape_s: float = 15.0


@dataclass(frozen=True, slots=True)
class Observation:
    now_s: float
    ready: int
    loading: int
    metric_rps: float  # the policy's pipeline value (total requests/s); NaN when missing
    panic_rps: float = math.nan  # a second, shorter window where the policy has one (Knative)
    ongoing: float = 0.0  # ongoing requests (queued + running) over all replicas, averaged over `ongoing_window_s`
    waiting: float = 0.0  # requests held with no ready replica (activator / gateway / handle queue)
    cold_start_p90_s: float = math.nan  # measured over this policy's own cold starts

    @property
    def total(self) -> int:
        return self.ready + self.loading


class SimPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def period_s(self) -> float: ...

    @property
    def pipelines(self) -> tuple[Pipeline, ...]: ...

    def initial_state(self) -> Any: ...

    def decide(self, obs: Observation, state: Any) -> tuple[int, Any]: ...


# --- Kubernetes HPA v2 --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HpaState:
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, pre-stabilization desired)
    changes: tuple[tuple[float, int], ...] = ()  # (time, replicas added (+) or removed (-))


@dataclass(frozen=True, slots=True)
class Hpa:
    """Kubernetes HorizontalPodAutoscaler (autoscaling/v2), `pkg/controller/podautoscaler/horizontal.go` and
    `replica_calculator.go`, with a Pods/External metric of type AverageValue (requests/s per replica, from
    Prometheus through prometheus-adapter: `rate(requests_total[1m])`, scraped every 15 s).

    - `sync_period_s` 15: kube-controller-manager `--horizontal-pod-autoscaler-sync-period` default.
    - `tolerance` 0.1: `--horizontal-pod-autoscaler-tolerance`; no change while |metric/target - 1| <= 0.1.
    - desired = ceil(total metric / target per replica) (AverageValue semantics).
    - default `behavior` (docs "Default Behavior"): scaleUp stabilization 0 s, policies Pods 4 per 15 s and
      Percent 100 per 15 s, selectPolicy Max; scaleDown stabilization 300 s, policy Percent 100 per 15 s.
      Stabilization keeps every recommendation: up = min over the up window, down = max over the down window.
    - a missing metric holds the current replicas (the controller logs FailedGetExternalMetric and skips).
    - HPA does not scale from or to zero (minReplicas >= 1 without the alpha HPAScaleToZero gate).
    """

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 200
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_up_stabilization_s: float = 0.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_policy_period_s: float = 15.0
    scale_down_stabilization_s: float = 300.0
    scale_down_percent: float = 100.0
    scale_down_policy_period_s: float = 15.0
    metric_scrape_s: float = 15.0
    metric_window_s: float = 60.0
    name: str = "hpa"

    @property
    def period_s(self) -> float:
        return self.sync_period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("prometheus", self.metric_window_s, self.metric_scrape_s),)

    def initial_state(self) -> HpaState:
        return HpaState()

    def decide(self, obs: Observation, state: HpaState) -> tuple[int, HpaState]:
        return hpa_decide(self, obs.now_s, obs.total, obs.metric_rps, state, min_replicas=max(1, self.min_replicas))


def hpa_decide(
    hpa: Hpa, now: float, current: int, metric_rps: float, state: HpaState, *, min_replicas: int
) -> tuple[int, HpaState]:
    if current == 0 or math.isnan(metric_rps):
        return current, state
    target = hpa.target_rps_per_replica
    ratio = metric_rps / (target * current)
    desired = current if abs(ratio - 1.0) <= hpa.tolerance else math.ceil(metric_rps / target - 1e-9)
    keep_s = max(hpa.scale_up_stabilization_s, hpa.scale_down_stabilization_s)
    recs = (*((t, n) for t, n in state.recommendations if t > now - keep_s), (now, desired))
    up = min(n for t, n in recs if t > now - hpa.scale_up_stabilization_s or t == now)
    down = max(n for t, n in recs if t > now - hpa.scale_down_stabilization_s or t == now)
    stabilized = min(max(current, up), down)
    # rate limits relative to the replicas at the start of the policy period
    # (horizontal.go, calculateScaleUpLimitWithScalingRules / calculateScaleDownLimitWithBehaviors)
    if stabilized > current:
        added = sum(d for t, d in state.changes if d > 0 and t > now - hpa.scale_up_policy_period_s)
        start = current - added
        limit = max(start + hpa.scale_up_pods, math.ceil(start * (1 + hpa.scale_up_percent / 100)))
        stabilized = min(stabilized, limit)
    elif stabilized < current:
        removed = -sum(d for t, d in state.changes if d < 0 and t > now - hpa.scale_down_policy_period_s)
        start = current + removed
        limit = math.ceil(start * (1 - hpa.scale_down_percent / 100))
        stabilized = max(stabilized, limit)
    new = min(max(stabilized, min_replicas), hpa.max_replicas)
    changes = tuple((t, d) for t, d in state.changes if t > now - 60.0)
    if new != current:
        changes = (*changes, (now, new - current))
    return new, HpaState(recs, changes)


# --- Knative Serving KPA ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KpaState:
    panic_since_s: float | None = None  # when panic mode was last (re)entered
    max_panic_pods: int = 0
    zero_wanted_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class Kpa:
    """Knative Serving's KPA, `pkg/autoscaler/scaling/autoscaler.go` (`Scale`), defaults from
    `config-autoscaler` (docs "Configuring the autoscaler"), metric `rps` with target = C:

    - `stable_window_s` 60 (`stable-window`), panic window 10 % of it = 6 s (`panic-window-percentage`),
      `panic_threshold` 2.0 (`panic-threshold-percentage` 200), `target_utilization` 0.7
      (`target-utilization-percentage` 70: the autoscaler aims at 70 % of the target per pod).
    - `max_scale_up_rate` 1000, `max_scale_down_rate` 2 (relative to ready pods per decision).
    - `tick_s` 2 (`tick-interval`); metrics are scraped from the queue-proxies every second (direct).
    - panic mode: entered when the panic-window demand is >= 2x the ready pods' capacity; while in panic, never
      scale down; left after a stable window without exceeding the threshold.
    - scale to zero (if `min_replicas` is 0): after the stable window averages zero and the
      `scale_to_zero_grace_s` 30 s (`scale-to-zero-grace-period`); from zero the activator buffers requests and
      wakes the revision at once.
    """

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 200
    target_utilization: float = 0.7
    stable_window_s: float = 60.0
    panic_window_fraction: float = 0.1
    panic_threshold: float = 2.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    tick_s: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    name: str = "kpa"

    @property
    def period_s(self) -> float:
        return self.tick_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (
            Pipeline("direct", self.stable_window_s),
            Pipeline("direct", self.stable_window_s * self.panic_window_fraction),
        )

    def initial_state(self) -> KpaState:
        return KpaState()

    def decide(self, obs: Observation, state: KpaState) -> tuple[int, KpaState]:
        now = obs.now_s
        if math.isnan(obs.metric_rps):
            return obs.total, state
        target = self.target_rps_per_replica * self.target_utilization
        ready = max(1, obs.ready)
        panic_rps = obs.metric_rps if math.isnan(obs.panic_rps) else obs.panic_rps
        max_up = math.ceil(self.max_scale_up_rate * ready)
        max_down = math.floor(ready / self.max_scale_down_rate)
        dspc = min(max(math.ceil(obs.metric_rps / target - 1e-9), max_down), max_up)
        dppc = min(max(math.ceil(panic_rps / target - 1e-9), max_down), max_up)
        over_panic = (panic_rps / target) / ready >= self.panic_threshold
        panic_since = state.panic_since_s
        if over_panic:
            panic_since = now
        elif panic_since is not None and now >= panic_since + self.stable_window_s:
            panic_since = None
        if panic_since is not None:
            desired = max(dppc, state.max_panic_pods, obs.total)
            max_panic = desired
        else:
            desired, max_panic = dspc, 0
        if obs.total == 0 and obs.waiting > 0:
            desired = max(desired, 1)  # the activator's poke
        zero_since = state.zero_wanted_since_s
        if desired == 0 and self.min_replicas == 0:
            zero_since = now if zero_since is None else zero_since
            if now - zero_since < self.scale_to_zero_grace_s and obs.total > 0:
                desired = 1
        else:
            zero_since = None
        floor = self.min_replicas
        desired = min(max(desired, floor if floor > 0 else (0 if desired == 0 else 1)), self.max_replicas)
        return desired, KpaState(panic_since, max_panic, zero_since)


# --- KEDA --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KedaState:
    hpa: HpaState = field(default_factory=HpaState)
    last_active_s: float = -math.inf
    active: bool = False


@dataclass(frozen=True, slots=True)
class Keda:
    """KEDA ScaledObject with a Prometheus trigger (`query: sum(rate(requests_total[1m]))`,
    `metricType: AverageValue`, `threshold: C`), defaults from the ScaledObject spec docs:

    - `polling_interval_s` 30 (`pollingInterval`): how often the operator checks activity (0 <-> 1).
    - `cooldown_period_s` 300 (`cooldownPeriod`): after the last active poll, wait this long before 1 -> 0.
    - `activation_threshold` 0 (`activationThreshold`): active while the metric is above it.
    - `min_replicas` 0 (`minReplicaCount` default) when the service allows zero, else its minimum.
    - 1 <-> N is a regular HPA on KEDA's external metric, with HPA's default behavior (see `Hpa`) and its 15 s
      sync; the metrics server queries Prometheus on each HPA request (no cache by default).
    """

    target_rps_per_replica: float
    min_replicas: int = 0
    max_replicas: int = 200
    polling_interval_s: float = 30.0
    cooldown_period_s: float = 300.0
    activation_threshold: float = 0.0
    hpa: Hpa | None = None
    name: str = "keda"

    @property
    def period_s(self) -> float:
        return self._hpa().sync_period_s

    def _hpa(self) -> Hpa:
        return self.hpa or Hpa(self.target_rps_per_replica, max(1, self.min_replicas), self.max_replicas)

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return self._hpa().pipelines

    def initial_state(self) -> KedaState:
        return KedaState()

    def decide(self, obs: Observation, state: KedaState) -> tuple[int, KedaState]:
        now = obs.now_s
        polled = math.floor(now / self.polling_interval_s) != math.floor(
            (now - self.period_s) / self.polling_interval_s
        )
        active, last_active = state.active, state.last_active_s
        if polled and not math.isnan(obs.metric_rps):
            active = obs.metric_rps > self.activation_threshold
            if active:
                last_active = now
        st = replace(state, active=active, last_active_s=last_active)
        if obs.total == 0:
            return (max(1, self.min_replicas) if active and polled else 0), st
        if self.min_replicas == 0 and polled and not active and now - last_active >= self.cooldown_period_s:
            return 0, st
        n, hpa_state = hpa_decide(
            self._hpa(), now, obs.total, obs.metric_rps, state.hpa, min_replicas=max(1, self.min_replicas)
        )
        return n, replace(st, hpa=hpa_state)


# --- Ray Serve ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayServeState:
    wanted_since_s: float | None = None  # since when the desired count has pointed the same way
    direction: int = 0  # +1 up, -1 down


@dataclass(frozen=True, slots=True)
class RayServe:
    """Ray Serve's default autoscaling policy (`ray/serve/autoscaling_policy.py`,
    `replica_queue_length_autoscaling_policy`, and `AutoscalingConfig` defaults):

    - metric: ongoing requests (queued + running) per replica, averaged over `look_back_period_s` 30, pushed
      every `metrics_interval_s` 10.
    - desired = ceil(running replicas * (1 + (ongoing / (target * running) - 1) * smoothing_factor)),
      `smoothing_factor` 1.0 (upscaling/downscaling factors unset).
    - `upscale_delay_s` 30 / `downscale_delay_s` 600: a change is applied only after the decision has pointed the
      same way for that long (the policy counts consecutive control-loop decisions; 0.1 s loop).
    - from zero: any queued request scales to 1 at once; to zero after `downscale_delay_s` too
      (`downscale_to_zero_delay_s` unset) when `min_replicas` is 0.
    - `target_ongoing_requests`: the default is 2, which is meaningless for a server that runs many requests
      at once; Ray's docs tell users to set it from the replica's capacity, so here it is C x mean latency at
      load C (Little's law: the ongoing requests of a replica serving exactly its SLO capacity).
    """

    target_ongoing_requests: float
    min_replicas: int = 1
    max_replicas: int = 200
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    smoothing_factor: float = 1.0
    look_back_period_s: float = 30.0
    control_loop_s: float = 1.0  # Ray's is 0.1 s; the simulator decides at most once per tick
    name: str = "ray-serve"

    @property
    def period_s(self) -> float:
        return self.control_loop_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("direct", self.look_back_period_s),)

    def initial_state(self) -> RayServeState:
        return RayServeState()

    def decide(self, obs: Observation, state: RayServeState) -> tuple[int, RayServeState]:
        now, curr = obs.now_s, obs.total
        if curr == 0:
            if obs.waiting > 0 or obs.ongoing > 0:
                return max(1, self.min_replicas), RayServeState()
            return 0, state
        running = max(1, obs.ready)
        ratio = obs.ongoing / (self.target_ongoing_requests * running)
        desired = math.ceil(running * (1 + (ratio - 1) * self.smoothing_factor) - 1e-9)
        desired = min(max(desired, self.min_replicas), self.max_replicas)
        direction = (desired > curr) - (desired < curr)
        if direction == 0:
            return curr, RayServeState()
        since = state.wanted_since_s if state.direction == direction and state.wanted_since_s is not None else now
        delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
        if now - since >= delay:
            return desired, RayServeState()
        return curr, RayServeState(since, direction)


# --- AIBrix APA --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AibrixApa:
    """AIBrix's APA (`pkg/controller/podautoscaler/algorithm/apa.go`, scaling context defaults in
    `pkg/controller/podautoscaler/common/context.go`, Helm values):

    - per-pod metric averaged over `window_s` 30 (`targetMetricWindow`), scraped from the pods (direct).
    - `up_fluctuation_tolerance` 0.1: scale up only if per-pod use / target > 1.1;
      `down_fluctuation_tolerance` 0.2: scale down only if < 0.8.
    - expected = ceil(current * use / target), limited by `max_scale_up_rate` 2 (at most ceil(2 x current))
      and `max_scale_down_rate` 2 (at least floor(current / 2)).
    - reconciled every `sync_period_s` (15 s here; AIBrix requeues its PodAutoscaler periodically).
    - no scale to zero in APA.
    """

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 200
    up_fluctuation_tolerance: float = 0.1
    down_fluctuation_tolerance: float = 0.2
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    window_s: float = 30.0
    sync_period_s: float = 15.0
    name: str = "aibrix-apa"

    @property
    def period_s(self) -> float:
        return self.sync_period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("direct", self.window_s),)

    def initial_state(self) -> None:
        return None

    def decide(self, obs: Observation, state: None) -> tuple[int, None]:
        current = obs.total
        if current == 0 or math.isnan(obs.metric_rps):
            return max(current, 1, self.min_replicas), None
        use = obs.metric_rps / max(1, obs.ready)
        ratio = use / self.target_rps_per_replica
        if ratio > 1 + self.up_fluctuation_tolerance:
            desired = min(math.ceil(current * ratio - 1e-9), math.ceil(self.max_scale_up_rate * current))
        elif ratio < 1 - self.down_fluctuation_tolerance:
            desired = max(math.ceil(current * ratio - 1e-9), math.floor(current / self.max_scale_down_rate))
        else:
            desired = current
        return min(max(desired, 1, self.min_replicas), self.max_replicas), None


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
        return range_window_s(self.service.spec.scaling.metric.query) or self.period_s

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

    def decide(self, obs: Observation, state: Any) -> tuple[int, Any]:
        raise TypeError("infer-ctl plans replicas by name: the simulator calls InferCtl.plan")
