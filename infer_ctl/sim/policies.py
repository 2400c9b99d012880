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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from infer_ctl.core.api import InferenceService
from infer_ctl.core.policy import effective_scaling
from infer_ctl.core.promql import range_window_s
from infer_ctl.core.runtime import rate_query
from infer_ctl.engine.burst import BurstBasis, burst_basis
from infer_ctl.engine.cycle import CyclePlan, CyclePolicies, CycleState, ObservedReplica, plan_cycle, service_policy
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


# --- Kubernetes HPA (autoscaling/v2) -----------------------------------------------------------------------------
#
# Ported from k8s.io/kubernetes v1.37.2, pkg/controller/podautoscaler: replica_calculator.go (the per-metric
# replica counts) and horizontal.go (reconcileAutoscaler, the normalisation with and without `behavior`). Each
# function below is one upstream function, named in its docstring; tests/sim/test_peers_upstream.py replays the
# upstream test tables through them.


class HpaMetricError(ValueError):
    """The replica calculator could not compute a count (upstream returns an error: the controller sets
    ScalingActive=False and does not rescale)."""


@dataclass(frozen=True, slots=True)
class Tolerances:
    """replica_calculator.go `Tolerances`: no change while 1 - scale_down <= usage ratio <= 1 + scale_up
    (`--horizontal-pod-autoscaler-tolerance` 0.1 both ways, or per direction from `behavior.*.tolerance`)."""

    scale_down: float = 0.1
    scale_up: float = 0.1

    def within(self, usage_ratio: float) -> bool:
        return 1.0 - self.scale_down <= usage_ratio <= 1.0 + self.scale_up


@dataclass(frozen=True, slots=True)
class PodSample:
    """One Pod as the replica calculator sees it: its phase, whether it is being deleted, and its metric value
    (None when the metrics API returned none for it)."""

    name: str
    metric: float | None
    phase: str = "Running"  # Pending | Running | Succeeded | Failed
    deleting: bool = False


def hpa_group_pods(pods: Sequence[PodSample]) -> tuple[int, set[str], set[str], set[str]]:
    """`groupPods` for a non-resource metric: (ready count, unready, missing, ignored). Deleted and Failed Pods
    are ignored, Pending ones unready, Running ones with no metric missing; the rest count as ready (the
    readiness and initialisation checks are for CPU only)."""
    ready = 0
    unready: set[str] = set()
    missing: set[str] = set()
    ignored: set[str] = set()
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            ignored.add(pod.name)
        elif pod.phase == "Pending":
            unready.add(pod.name)
        elif pod.metric is None:
            missing.add(pod.name)
        else:
            ready += 1
    return ready, unready, missing, ignored


def hpa_pod_metric_replicas(
    current: int, target_per_pod: float, pods: Sequence[PodSample], tolerances: Tolerances = Tolerances()
) -> tuple[int, float]:
    """`calcPlainMetricReplicas` (a Pods metric, AverageValue target) with `groupPods` for a non-resource metric:
    returns (replicas, average usage of the Pods with a metric). Deleted or Failed Pods are ignored, Pending ones
    are unready, Running ones without a metric are missing (readiness is only looked at for CPU). On a scale-up
    missing and unready Pods count as using 0, on a scale-down missing ones as using exactly the target; if that
    changes the direction, or brings the ratio within the tolerance, the current count stays.

    E.g. 5 replicas, metrics 20000/19000/21000 for three, target 20000: ratio 1.0 with two missing, the missing
    ones are not filled (neither above nor below 1), the recomputed ratio is within the tolerance: 5 stay.
    Upstream averages integer milli-values (truncating); this works in floats."""
    if not pods:
        raise HpaMetricError("no pods returned by selector while calculating replica count")
    ready_count, unready, missing, _ = hpa_group_pods(pods)
    metrics = {p.name: p.metric for p in pods if p.metric is not None and p.name not in unready
               and not p.deleting and p.phase != "Failed"}
    if not metrics:
        raise HpaMetricError("did not receive metrics for targeted pods (pods might be unready)")
    usage = sum(metrics.values()) / len(metrics)
    ratio = usage / target_per_pod
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.within(ratio):
            return current, usage
        return math.ceil(ratio * ready_count), usage
    if missing and ratio != 1.0:
        fill = target_per_pod if ratio < 1.0 else 0.0
        metrics.update((name, fill) for name in missing)
    if scale_up_with_unready:
        metrics.update((name, 0.0) for name in unready)
    new_ratio = sum(metrics.values()) / len(metrics) / target_per_pod
    if tolerances.within(new_ratio) or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
        return current, usage
    replicas = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current, usage
    return replicas, usage


def hpa_external_per_pod_replicas(
    status_replicas: int, target_per_pod: float, usage: float, tolerances: Tolerances = Tolerances()
) -> tuple[int, float]:
    """`GetExternalPerPodMetricReplicas` (an External metric with an AverageValue target, what KEDA creates):
    ratio = usage / (target x status replicas, loading Pods included); outside the tolerance, ceil(usage /
    target). Returns (replicas, usage per replica). E.g. usage 8600, target 2150, 3 replicas: ratio 1.33 -> 4."""
    replicas = status_replicas
    if not tolerances.within(usage / (target_per_pod * status_replicas)):
        replicas = math.ceil(usage / target_per_pod)
    return replicas, usage / status_replicas


@dataclass(frozen=True, slots=True)
class HpaScalingPolicy:
    """`HPAScalingPolicy`: at most `value` Pods (kind Pods) or `value` percent (kind Percent) per `period_s`."""

    kind: str  # Pods | Percent
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class HpaScalingRules:
    """`HPAScalingRules`; a field left None takes the API default (`GenerateHPAScaleUpRules` /
    `GenerateHPAScaleDownRules`, pkg/apis/autoscaling/v2/defaults.go)."""

    stabilization_window_s: float | None = None
    select_policy: str | None = None  # Max | Min | Disabled
    policies: tuple[HpaScalingPolicy, ...] | None = None
    tolerance: float | None = None


@dataclass(frozen=True, slots=True)
class HpaBehavior:
    scale_up: HpaScalingRules | None = None
    scale_down: HpaScalingRules | None = None


DEFAULT_SCALE_UP = HpaScalingRules(
    0.0, "Max", (HpaScalingPolicy("Pods", 4, 15.0), HpaScalingPolicy("Percent", 100, 15.0))
)
DEFAULT_SCALE_DOWN = HpaScalingRules(None, "Max", (HpaScalingPolicy("Percent", 100, 15.0),))


def _with_defaults(rules: HpaScalingRules | None, default: HpaScalingRules) -> HpaScalingRules:
    """`copyHPAScalingRules(rules, default)`: the given fields over the defaults."""
    if rules is None:
        return default
    return HpaScalingRules(
        default.stabilization_window_s if rules.stabilization_window_s is None else rules.stabilization_window_s,
        rules.select_policy or default.select_policy,
        default.policies if rules.policies is None else rules.policies,
        default.tolerance if rules.tolerance is None else rules.tolerance,
    )


def hpa_scale_up_rules(rules: HpaScalingRules | None) -> HpaScalingRules:
    """`GenerateHPAScaleUpRules`: no stabilization, Max of 4 Pods and 100 % per 15 s."""
    return _with_defaults(rules, DEFAULT_SCALE_UP)


def hpa_scale_down_rules(rules: HpaScalingRules | None) -> HpaScalingRules:
    """`GenerateHPAScaleDownRules`: 100 % per 15 s; the stabilization window is left to the controller's
    `--horizontal-pod-autoscaler-downscale-stabilization` (`maybeInitScaleDownStabilizationWindow`)."""
    return _with_defaults(rules, DEFAULT_SCALE_DOWN)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """`timestampedScaleEvent`: replicas added (scale-up list) or removed (scale-down list) at `time_s`."""

    change: int
    time_s: float
    outdated: bool = False


Recommendation = tuple[int, float]  # (replicas, time_s): `timestampedRecommendation`


def hpa_replicas_change_per_period(period_s: float, events: Sequence[ScaleEvent], now: float) -> int:
    """`getReplicasChangePerPeriod`: the changes strictly after now - period."""
    return sum(e.change for e in events if e.time_s > now - period_s)


def hpa_store_scale_event(
    events: Sequence[ScaleEvent], change: int, rules: HpaScalingRules, now: float
) -> tuple[ScaleEvent, ...]:
    """`storeScaleEvent` for one direction (only with a `behavior`): events older than the longest policy
    period are marked outdated, and the new event takes the place of the last outdated one (or is appended)."""
    longest = max((p.period_s for p in rules.policies or ()), default=0.0)
    marked = [replace(e, outdated=True) if e.time_s < now - longest else e for e in events]
    new = ScaleEvent(change, now)
    old = [i for i, e in enumerate(marked) if e.outdated]
    if old:
        marked[old[-1]] = new
    else:
        marked.append(new)
    return tuple(marked)


def _hpa_limit(current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: HpaScalingRules,
               now: float, *, upward: bool) -> int:
    """Both directions' limit: each policy's bound from the replicas at the start of its period (current - added
    + removed in that period); upward, Max takes the largest and Min the smallest, downward the mirror image;
    Disabled none."""
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for p in rules.policies or ():
        start = current - hpa_replicas_change_per_period(p.period_s, up, now) + hpa_replicas_change_per_period(
            p.period_s, down, now)
        if upward:
            proposals.append(start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
        else:
            proposals.append(start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100)))
    most = (rules.select_policy == "Min") != upward  # upward Max, or downward Min: the largest
    return max(proposals) if most else min(proposals)


def hpa_scale_up_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: HpaScalingRules, now: float
) -> int:
    """`calculateScaleUpLimitWithScalingRules`: each policy's limit from the replicas at the start of its period
    (current - added + removed in that period); Max takes the largest, Min the smallest, Disabled none.
    E.g. Pods 4 and Percent 100 per 15 s from 10 replicas with no recent events: max(14, 20) = 20."""
    return _hpa_limit(current, up, down, rules, now, upward=True)


def hpa_scale_down_limit(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: HpaScalingRules, now: float
) -> int:
    """`calculateScaleDownLimitWithBehaviors`: the mirror image (Percent truncates: int(start x (1 - v/100)))."""
    return _hpa_limit(current, up, down, rules, now, upward=False)


def hpa_convert_with_behavior_rate(
    current: int, desired: int, *, min_replicas: int, max_replicas: int, up: Sequence[ScaleEvent],
    down: Sequence[ScaleEvent], up_rules: HpaScalingRules, down_rules: HpaScalingRules, now: float,
) -> tuple[int, str]:
    """`convertDesiredReplicasWithBehaviorRate`: the rate limits and the bounds; returns (replicas, the
    ScalingLimited reason)."""
    if desired > current:
        limit = max(hpa_scale_up_limit(current, up, down, up_rules, now), current)
        allowed, reason = (limit, "ScaleUpLimit") if max_replicas > limit else (max_replicas, "TooManyReplicas")
        if desired > allowed:
            return allowed, reason
    elif desired < current:
        limit = min(hpa_scale_down_limit(current, up, down, down_rules, now), current)
        allowed, reason = (limit, "ScaleDownLimit") if min_replicas < limit else (min_replicas, "TooFewReplicas")
        if desired < allowed:
            return allowed, reason
    return desired, "DesiredWithinRange"


def hpa_convert_with_rules(current: int, desired: int, min_replicas: int, max_replicas: int) -> tuple[int, str]:
    """`convertDesiredReplicasWithRules` (an HPA without `behavior`): at most max(2 x current, 4) at once,
    within the bounds; no scale-down rate limit."""
    scale_up_limit = int(max(2.0 * current, 4.0))
    upper, reason = (scale_up_limit, "ScaleUpLimit") if max_replicas > scale_up_limit else (
        max_replicas, "TooManyReplicas")
    if desired < min_replicas:
        return min_replicas, "TooFewReplicas"
    if desired > upper:
        return upper, reason
    return desired, "DesiredWithinRange"


def hpa_stabilize(
    recs: Sequence[Recommendation], desired: int, window_s: float, now: float
) -> tuple[int, tuple[Recommendation, ...]]:
    """`stabilizeRecommendation` (no `behavior`): the highest recommendation of the last `window_s` (the
    `--horizontal-pod-autoscaler-downscale-stabilization` window, 5 minutes); the new one replaces the last
    older sample, or is appended."""
    highest = desired
    old = None
    for i, (r, t) in enumerate(recs):
        if t < now - window_s:
            old = i
        elif r > highest:
            highest = r
    out = list(recs)
    if old is None:
        out.append((desired, now))
    else:
        out[old] = (desired, now)
    return highest, tuple(out)


def hpa_stabilize_with_behaviors(
    recs: Sequence[Recommendation], desired: int, current: int, *, up_window_s: float, down_window_s: float,
    now: float,
) -> tuple[int, tuple[Recommendation, ...]]:
    """`stabilizeRecommendationWithBehaviors`: the current count brought within [lowest recommendation of the
    scale-up window, highest of the scale-down window]; the new recommendation replaces the last sample older
    than both windows, or is appended. E.g. recommendations 4 and 5 in the last 3 minutes, 100 replicas, 3
    desired, a 3-minute scale-down window: 5."""
    up_rec, down_rec = desired, desired
    old = None
    for i, (r, t) in enumerate(recs):
        if t > now - up_window_s:
            up_rec = min(r, up_rec)
        if t > now - down_window_s:
            down_rec = max(r, down_rec)
        if t < now - up_window_s and t < now - down_window_s:
            old = i
    out = list(recs)
    if old is None:
        out.append((desired, now))
    else:
        out[old] = (desired, now)
    return min(max(current, up_rec), down_rec), tuple(out)


@dataclass(frozen=True, slots=True)
class HpaState:
    recommendations: tuple[Recommendation, ...] | None = None  # None: not yet recorded (a new HPA)
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Hpa:
    """Kubernetes' HorizontalPodAutoscaler (v1.37.2), reconciled every `sync_period_s`, on one metric:

    - `metric` "Pods" (the default here): a per-Pod metric with an AverageValue target of C requests/s, served
      by prometheus-adapter from `rate(requests_total[1m])` (Prometheus scraping every 15 s), each ready replica
      reporting its share of the traffic and a loading one none (`hpa_pod_metric_replicas`). "External": one
      fleet-wide value with an AverageValue target, as KEDA creates (`hpa_external_per_pod_replicas`).
    - tolerance 0.1 (`--horizontal-pod-autoscaler-tolerance`), sync period 15 s
      (`--horizontal-pod-autoscaler-sync-period`), downscale stabilization 300 s
      (`--horizontal-pod-autoscaler-downscale-stabilization`).
    - `behavior` None (an HPA that does not set it, the common case): the highest recommendation of the last 5
      minutes, scale-up limited to max(2 x current, 4), no scale-down rate limit (`normalizeDesiredReplicas`).
      With a `behavior`, its rules (API defaults for unset fields) are applied as
      `normalizeDesiredReplicasWithBehaviors` does.
    - A new HPA records the current count as its first recommendation (`recordInitialRecommendation`), so it
      does not scale down within 5 minutes of its creation. A metric it cannot read holds the count.
    - `minReplicas` >= 1: scaling to zero (the HPAScaleToZero gate, beta in 1.37) needs an Object or External
      metric, which the Pods-metric HPA here does not have; KEDA plays that role.
    """

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 200
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    downscale_stabilization_s: float = 300.0
    behavior: HpaBehavior | None = None
    metric: str = "Pods"  # Pods | External
    metric_scrape_s: float = 15.0
    metric_window_s: float = 60.0
    name: str = "hpa"

    def __post_init__(self) -> None:
        if self.metric not in ("Pods", "External"):
            raise ValueError(f"metric: {self.metric!r} is not one of Pods, External")
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas: {self.min_replicas} must be >= 1 for a {self.metric} metric")

    @property
    def period_s(self) -> float:
        return self.sync_period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("prometheus", self.metric_window_s, self.metric_scrape_s),)

    def initial_state(self) -> HpaState:
        return HpaState()

    def tolerances(self) -> Tolerances:
        """`tolerancesForHpa`: the flag's tolerance, or each direction's `behavior` tolerance where set."""
        b = self.behavior
        down = b.scale_down.tolerance if b and b.scale_down and b.scale_down.tolerance is not None else None
        up = b.scale_up.tolerance if b and b.scale_up and b.scale_up.tolerance is not None else None
        return Tolerances(self.tolerance if down is None else down, self.tolerance if up is None else up)

    def metric_replicas(self, obs: Observation, current: int) -> int:
        """The metric's proposal (`computeReplicasForMetric`); HpaMetricError when it has no value."""
        if math.isnan(obs.metric_rps):
            raise HpaMetricError("unable to get metric: no samples")
        if self.metric == "External":
            return hpa_external_per_pod_replicas(current, self.target_rps_per_replica, obs.metric_rps,
                                                 self.tolerances())[0]
        share = obs.metric_rps / obs.ready if obs.ready else 0.0
        pods = [PodSample(f"ready-{i}", share) for i in range(obs.ready)]
        pods += [PodSample(f"loading-{i}", None) for i in range(obs.loading)]
        return hpa_pod_metric_replicas(current, self.target_rps_per_replica, pods, self.tolerances())[0]

    def decide(self, obs: Observation, state: HpaState) -> tuple[int, HpaState]:
        return self.reconcile(obs.now_s, obs.total, lambda current: self.metric_replicas(obs, current), state)

    def reconcile(
        self, now: float, current: int, metric_replicas: Callable[[int], int], state: HpaState
    ) -> tuple[int, HpaState]:
        """`reconcileAutoscaler`: the bounds first, then the metric's proposal normalised."""
        recs = state.recommendations if state.recommendations is not None else ((current, now),)
        state = replace(state, recommendations=recs)
        if current == 0:
            return 0, state  # "scaling is disabled since the replica count of the target is zero"
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            try:
                proposal = metric_replicas(current)
            except HpaMetricError:
                return current, state
            desired, state = self.normalize(now, current, proposal, state)
        if desired != current and self.behavior is not None:
            if desired > current:
                events = hpa_store_scale_event(state.scale_up_events, desired - current,
                                               hpa_scale_up_rules(self.behavior.scale_up), now)
                state = replace(state, scale_up_events=events)
            else:
                events = hpa_store_scale_event(state.scale_down_events, current - desired,
                                               self._down_rules(), now)
                state = replace(state, scale_down_events=events)
        return desired, state

    def _down_rules(self) -> HpaScalingRules:
        rules = hpa_scale_down_rules(self.behavior.scale_down if self.behavior else None)
        if rules.stabilization_window_s is None:
            rules = replace(rules, stabilization_window_s=self.downscale_stabilization_s)
        return rules

    def normalize(self, now: float, current: int, proposal: int, state: HpaState) -> tuple[int, HpaState]:
        recs = state.recommendations or ()
        if self.behavior is None:
            stabilized, recs = hpa_stabilize(recs, proposal, self.downscale_stabilization_s, now)
            desired, _ = hpa_convert_with_rules(current, stabilized, self.min_replicas, self.max_replicas)
            return desired, replace(state, recommendations=recs)
        up_rules, down_rules = hpa_scale_up_rules(self.behavior.scale_up), self._down_rules()
        stabilized, recs = hpa_stabilize_with_behaviors(
            recs, proposal, current, up_window_s=up_rules.stabilization_window_s or 0.0,
            down_window_s=down_rules.stabilization_window_s or 0.0, now=now)
        desired, _ = hpa_convert_with_behavior_rate(
            current, stabilized, min_replicas=self.min_replicas, max_replicas=self.max_replicas,
            up=state.scale_up_events, down=state.scale_down_events, up_rules=up_rules, down_rules=down_rules, now=now)
        return desired, replace(state, recommendations=recs)


# --- Knative Serving KPA -----------------------------------------------------------------------------------------
#
# Ported from knative.dev/serving knative-v1.23.0: the decider pkg/autoscaler/scaling/autoscaler.go (`Scale`, every
# 2 s tick) and the PodAutoscaler reconciler's scaler pkg/reconciler/autoscaling/kpa/scaler.go (`scale`,
# `handleScaleToZero`) with kpa.go's `computeActiveCondition`, which together decide when a revision goes to zero.


@dataclass(frozen=True, slots=True)
class KpaState:
    started: bool = False  # the decider was created (at the first decision, from the ready pods then)
    panic_since_s: float | None = None  # `panicTime`: when panic mode was last (re)entered
    max_panic_pods: int = 0
    delayed: tuple[tuple[float, int], ...] = ()  # `delayWindow` (scale-down-delay): (time, desired)
    # the PodAutoscaler's Active condition (kpa.go) and when it last changed; a running service is Active
    pa_status: str = "active"  # active | inactive | activating
    pa_since_s: float = -math.inf


@dataclass(frozen=True, slots=True)
class Kpa:
    """Knative Serving's KPA (knative-v1.23.0) on the `rps` metric with a target of C requests/s per pod,
    defaults from `config-autoscaler` (pkg/autoscaler/config/config.go `defaultConfig`):

    - target value = C x `target_utilization` 0.7 (`target-utilization-percentage` applies to rps too,
      `ResolveMetricTarget`); `stable_window_s` 60, panic window 10 % of it (6 s), `panic_threshold` 2.0;
      `max_scale_up_rate` 1000 and `max_scale_down_rate` 2 relative to the ready pods; `scale_down_delay_s` 0;
      `activation_scale` 1; decided every 2 s (`tickInterval`); metrics averaged per second over each window
      from the queue-proxies (and the activator while the revision has no pod).
    - the decider (`kpa_scale`): desired = ceil(stable / target) within [floor(ready / 2), ceil(1000 x ready)];
      panic when ceil(panic / target) / ready >= 2, then never below the highest count of the panic; panic ends
      a stable window after the threshold was last crossed. A new decider starts in panic, holding the ready
      pods, when more than one is ready (it has no metric history).
    - the reconciler (`kpa_reconcile_scale`): bounds, then to zero only after the revision has been Active for
      a stable window (else 1), marked Inactive, and Inactive for `scale_to_zero_grace_s` 30.
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
    scale_down_delay_s: float = 0.0
    activation_scale: int = 1
    reachable: bool = True
    enable_scale_to_zero: bool = True
    tick_s: float = 2.0
    scale_to_zero_grace_s: float = 30.0
    name: str = "kpa"

    @property
    def period_s(self) -> float:
        return self.tick_s

    @property
    def target_value(self) -> float:
        return self.target_rps_per_replica * self.target_utilization

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (
            Pipeline("direct", self.stable_window_s),
            Pipeline("direct", self.stable_window_s * self.panic_window_fraction),
        )

    def initial_state(self) -> KpaState:
        return KpaState()

    def decide(self, obs: Observation, state: KpaState) -> tuple[int, KpaState]:
        if not state.started:
            state = kpa_new_decider(obs.ready, obs.now_s, state)
        panic = obs.metric_rps if math.isnan(obs.panic_rps) else obs.panic_rps
        desired, state = kpa_scale(self, state, obs.ready, stable_rps=obs.metric_rps, panic_rps=panic, now=obs.now_s)
        applied, state = kpa_reconcile_scale(self, state, desired, current=obs.total, ready=obs.ready, now=obs.now_s)
        return (obs.total if applied is None else applied), state


def kpa_new_decider(ready: int, now: float, state: KpaState = KpaState()) -> KpaState:
    """`newAutoscaler`: with more than one ready pod it starts in panic mode holding them (it has lost the
    metric history and must not scale down before it has some)."""
    return replace(state, started=True, panic_since_s=now if ready > 1 else None, max_panic_pods=ready)


def kpa_scale(kpa: Kpa, state: KpaState, ready: int, *, stable_rps: float, panic_rps: float,
              now: float) -> tuple[int | None, KpaState]:
    """`autoscaler.Scale`: the desired pod count, or None when there is no metric (`ScaleValid` false).

    E.g. target 10, 1 ready pod, stable 50, panic 100: dspc 5, dppc 10; 10 / 1 >= 2 so panic, and the larger of
    the two (within the rate limits [0, 1000]) is 10."""
    if math.isnan(stable_rps) or math.isnan(panic_rps):
        return None, state
    ready_f = max(1.0, float(ready))
    max_up = math.ceil(kpa.max_scale_up_rate * ready_f)
    max_down = math.floor(ready_f / kpa.max_scale_down_rate) if kpa.reachable else 0
    dspc = math.ceil(stable_rps / kpa.target_value)
    dppc = math.ceil(panic_rps / kpa.target_value)
    stable_pods = min(max(dspc, max_down), max_up)
    panic_pods = min(max(dppc, max_down), max_up)
    if kpa.activation_scale > 1:
        if dspc > 0 and kpa.activation_scale > stable_pods:
            stable_pods = kpa.activation_scale
        if dppc > 0 and kpa.activation_scale > panic_pods:
            panic_pods = kpa.activation_scale
    over = dppc / ready_f >= kpa.panic_threshold
    panic_since, max_panic = state.panic_since_s, state.max_panic_pods
    if over:
        panic_since = now
    elif panic_since is not None and panic_since + kpa.stable_window_s < now:
        panic_since, max_panic = None, 0
    desired = stable_pods
    if panic_since is not None:
        desired = max(desired, panic_pods)
        max_panic = max(max_panic, desired)  # no scale-down in panic
        desired = max_panic
    delayed = state.delayed
    if kpa.reachable and kpa.scale_down_delay_s > 0:
        # `delayWindow`: the highest desired count of the last scale-down-delay
        delayed = (*((t, d) for t, d in delayed if t > now - kpa.scale_down_delay_s), (now, desired))
        desired = max(d for _, d in delayed)
    return desired, replace(state, panic_since_s=panic_since, max_panic_pods=max_panic, delayed=delayed)


def kpa_reconcile_scale(
    kpa: Kpa, state: KpaState, desired: int | None, *, current: int, ready: int, now: float
) -> tuple[int | None, KpaState]:
    """The reconciler's `scaler.scale` and `computeActiveCondition`: the replicas to apply (None: leave the
    Deployment as it is) and the PodAutoscaler's Active condition. A desired 0 is applied only when the revision
    has been Inactive for the grace period; an Active revision is first scaled to 1 for the rest of its stable
    window, then marked Inactive (the activator takes the traffic) with its pods kept."""
    if desired is None:
        return None, state  # no metrics yet: nothing is applied, the condition is left as it is
    want = desired if desired >= kpa.min_replicas else kpa.min_replicas
    if kpa.max_replicas and want > kpa.max_replicas:
        want = kpa.max_replicas
    applied: int | None = want
    if want == 0:
        if not kpa.enable_scale_to_zero:
            applied = want = 1
        elif state.pa_status == "activating":
            applied, want = None, -1  # scaleUnknown until the activation times out (not simulated)
        elif state.pa_status == "active":
            if now - state.pa_since_s >= kpa.stable_window_s:
                applied = None  # mark Inactive, keep the pods
            else:
                applied = want = 1
        elif now - state.pa_since_s < kpa.scale_to_zero_grace_s:
            applied = None
    min_ready = max(1, kpa.min_replicas)
    status = state.pa_status
    if want == 0:
        status = "inactive"
    elif ready < min_ready:
        if want > 0 or status != "inactive":
            status = "activating"
    elif want > 0 or status != "inactive":
        status = "active"
    if status != state.pa_status:
        state = replace(state, pa_status=status, pa_since_s=now)
    if applied == current:
        applied = None
    return applied, state


# --- KEDA --------------------------------------------------------------------------------------------------------
#
# KEDA v2.20.2 (kedacore/keda): the operator's scale loop (pkg/scaling/executor/scale_scaledobjects.go,
# `RequestScale`) every `pollingInterval` decides 0 <-> active; between 1 and N an HPA on KEDA's External metric
# does the scaling (KEDA creates it with minReplicas = max(1, minReplicaCount) and no behavior of its own).


def keda_request_scale(
    current: int, is_active: bool, min_replica_count: int, last_active_s: float | None, now: float, *,
    cooldown_s: float = 300.0, initial_cooldown_s: float = 0.0, created_s: float = 0.0,
) -> tuple[int | None, float | None]:
    """`RequestScale` without idleReplicaCount, fallback or pause annotations: the replicas to set (None: leave
    them to the HPA) and the new LastActiveTime. Active: from zero to max(minReplicaCount, 1), else just
    LastActiveTime = now. Inactive with minReplicaCount 0: to zero once the cooldown after the last active poll
    is over (or the initial cooldown after creation when it was never active); below the minimum: to it."""
    if is_active:
        if current == 0:
            return (min_replica_count if min_replica_count > 0 else 1), now
        return None, now
    if current > 0 and min_replica_count == 0:
        never_active = last_active_s is None and created_s + initial_cooldown_s < now
        cooled_down = last_active_s is not None and last_active_s + cooldown_s < now
        return (min_replica_count if never_active or cooled_down else None), last_active_s
    if current < min_replica_count:
        return min_replica_count, last_active_s
    return None, last_active_s


@dataclass(frozen=True, slots=True)
class KedaState:
    hpa: HpaState = field(default_factory=HpaState)
    last_active_s: float | None = None


@dataclass(frozen=True, slots=True)
class Keda:
    """A KEDA ScaledObject with a Prometheus trigger (`query: sum(rate(requests_total[1m]))`, `threshold: C`,
    `metricType: AverageValue`), defaults from the ScaledObject spec: `pollingInterval` 30 s, `cooldownPeriod`
    300 s, `initialCooldownPeriod` 0, `activationThreshold` 0 (active while the query returns more than it),
    `minReplicaCount` 0 when the service allows zero. The HPA underneath (`Hpa` with an External metric) syncs
    every 15 s. A query with no samples counts as a scaler error (no activity decision): in the simulator that
    happens only before Prometheus has two scrapes, when a real service would have history."""

    target_rps_per_replica: float
    min_replicas: int = 0
    max_replicas: int = 200
    polling_interval_s: float = 30.0
    cooldown_period_s: float = 300.0
    initial_cooldown_period_s: float = 0.0
    activation_threshold: float = 0.0
    hpa: Hpa | None = None
    name: str = "keda"

    @property
    def period_s(self) -> float:
        return self._hpa().sync_period_s

    def _hpa(self) -> Hpa:
        return self.hpa or Hpa(self.target_rps_per_replica, max(1, self.min_replicas), self.max_replicas,
                               metric="External")

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return self._hpa().pipelines

    def initial_state(self) -> KedaState:
        return KedaState()

    def decide(self, obs: Observation, state: KedaState) -> tuple[int, KedaState]:
        now, current = obs.now_s, obs.total
        polled = math.floor(now / self.polling_interval_s) != math.floor(
            (now - self.period_s) / self.polling_interval_s)
        if polled and not math.isnan(obs.metric_rps):
            scaled, last_active = keda_request_scale(
                current, obs.metric_rps > self.activation_threshold, self.min_replicas, state.last_active_s, now,
                cooldown_s=self.cooldown_period_s, initial_cooldown_s=self.initial_cooldown_period_s)
            state = replace(state, last_active_s=last_active)
            if scaled is not None:
                return scaled, state
        n, hpa_state = self._hpa().decide(obs, state.hpa)
        return n, replace(state, hpa=hpa_state)


# --- Ray Serve ---------------------------------------------------------------------------------------------------
#
# Ray 2.60.0 (the PyPI wheel), ray/serve/autoscaling_policy.py: the default `replica_queue_length_autoscaling_policy`
# wrapped by `_apply_autoscaling_config` (cold-start fast path, scaling factors, delays), then the bounds
# (`DeploymentAutoscalingState.apply_bounds`).


@dataclass(frozen=True, slots=True)
class RayServeState:
    decision_counter: int = 0  # > 0 wanting up, < 0 wanting down (kept as upstream keeps it)
    decision_since_s: float | None = None  # when the current run of same-direction decisions began


@dataclass(frozen=True, slots=True)
class RayServe:
    """Ray Serve's default autoscaling policy and `AutoscalingConfig` defaults (Ray 2.60.0):

    - metric: the deployment's total ongoing requests (running + queued at the handles), averaged over
      `look_back_period_s` 30; `current` = running replicas, `target` = the replicas Serve is aiming for
      (starting ones included).
    - desired = total / `target_ongoing_requests`, moved from the running count by the up/down scaling factor
      (1.0); applied once the wish has pointed the same way for `upscale_delay_s` 30 / `downscale_delay_s` 600
      (`downscale_to_zero_delay_s` for 1 -> 0, unset: the same 600); a scale-down stops at 1 before 0.
    - with no running replica: requests waiting -> max(ceil(upscaling factor), target) at once; else hold.
    - `target_ongoing_requests`: the default is 2, which is meaningless for a server that runs many requests
      at once; Ray's docs tell users to set it from the replica's capacity, so here it is C x mean latency at
      load C (Little's law: the ongoing requests of a replica serving exactly its SLO capacity).
    - Ray's control loop runs every 0.1 s; the simulator decides once per tick (`control_loop_s`), which only
      rounds the delays up to a tick.
    """

    target_ongoing_requests: float
    min_replicas: int = 1
    max_replicas: int = 200
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    smoothing_factor: float = 1.0
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    look_back_period_s: float = 30.0
    control_loop_s: float = 1.0
    name: str = "ray-serve"

    @property
    def period_s(self) -> float:
        return self.control_loop_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("direct", self.look_back_period_s),)

    def initial_state(self) -> RayServeState:
        return RayServeState()

    def up_factor(self) -> float:
        return self.upscaling_factor or self.smoothing_factor

    def down_factor(self) -> float:
        return self.downscaling_factor or self.smoothing_factor

    def decide(self, obs: Observation, state: RayServeState) -> tuple[int, RayServeState]:
        n, state = ray_serve_policy(self, obs.ready, obs.total, obs.ongoing, state, now=obs.now_s)
        return max(self.min_replicas, min(self.max_replicas, n)), state


def ray_apply_scaling_factors(ray: RayServe, desired: float, current: int) -> int:
    """`_apply_scaling_factors`: current + factor x (desired - current), rounded up; a scale-down the factor
    would round away goes down by one. E.g. desired 5 from 20 at factor 0.5: ceil(12.5) = 13."""
    if current == 0:
        return math.ceil(desired)
    delta = desired - current
    scaled = math.ceil(current + (ray.up_factor() if delta > 0 else ray.down_factor()) * delta)
    if math.ceil(desired) < current and scaled == current:
        scaled -= 1
    return scaled


def ray_apply_delay_logic(
    ray: RayServe, desired: int, target: int, state: RayServeState, now: float
) -> tuple[int, RayServeState]:
    """`_apply_delay_logic`: the wish applies once it has pointed the same way since `decision_since_s` for the
    direction's delay; a scale-down to a positive count is at least 1, and 1 -> 0 waits its own delay."""
    counter, since = state.decision_counter, state.decision_since_s
    decision = target
    if desired > target:
        if counter < 0:
            counter, since = 0, None
        counter += 1
        since = now if since is None else since
        if now - since + 1e-6 >= ray.upscale_delay_s:
            counter, since, decision = 0, None, desired
    elif desired < target:
        if counter > 0:
            counter, since = 0, None
        counter -= 1
        delay = ray.downscale_delay_s
        if target == 1:
            delay = ray.downscale_to_zero_delay_s if ray.downscale_to_zero_delay_s is not None else delay
        else:
            desired = max(1, desired)
        since = now if since is None else since
        if now - since + 1e-6 >= delay:
            counter, since, decision = 0, None, desired
    else:
        counter, since = 0, None
    return decision, RayServeState(counter, since)


def ray_serve_policy(
    ray: RayServe, running: int, target: int, total_requests: float, state: RayServeState, *, now: float
) -> tuple[int, RayServeState]:
    """The wrapped default policy (before the bounds): the cold-start fast path, else the queue-length policy
    (`_core_replica_queue_length_policy`: running x total / (target ongoing x running)), the scaling factors and
    the delays (`_apply_default_params`)."""
    if running == 0 and total_requests > 0:
        return max(math.ceil(1 * ray.up_factor()), target), state
    desired_f = float(target) if running == 0 else running * (
        total_requests / (ray.target_ongoing_requests * running))
    desired = ray_apply_scaling_factors(ray, desired_f, running)
    if running == 0 and desired > 0:
        return desired, state
    return ray_apply_delay_logic(ray, max(0, desired), target, state, now)


# --- AIBrix APA --------------------------------------------------------------------------------------------------
#
# AIBrix v0.7.0 (vllm-project/aibrix): pkg/controller/podautoscaler/algorithm/apa.go (`computeTargetReplicas`),
# the metric window of metrics/client.go and types/metrics.go (`TimeWindow`), and the controller's bounds and
# cooldown (podautoscaler_controller.go `computeScaleDecision`, `stabilizeRecommendation`); defaults from
# context/context.go `NewBaseScalingContext`.


def apa_compute_target_replicas(
    current_pods: float, use_per_pod: float, target: float, *, up_tolerance: float = 0.1,
    down_tolerance: float = 0.1, max_scale_up_rate: float = 2.0, max_scale_down_rate: float = 2.0,
) -> int:
    """`APAAlgorithm.computeTargetReplicas`: above (1 + up tolerance) x target per pod, ceil(current x
    use / target) capped at ceil(max up rate x current); below (1 - down tolerance), the same floored at
    floor(current / max down rate); otherwise no change. A target <= 0 keeps the current count (upstream logs
    an error). E.g. 2 pods at 90 against 30: 6 wanted, at most ceil(2 x 2) = 4."""
    if target <= 0:
        return int(current_pods)
    ratio = use_per_pod / target
    if ratio > 1 + up_tolerance:
        return min(math.ceil(current_pods * ratio), math.ceil(max_scale_up_rate * current_pods))
    if ratio < 1 - down_tolerance:
        return max(math.ceil(current_pods * ratio), math.floor(current_pods / max_scale_down_rate))
    return int(current_pods)


def aibrix_stabilize(
    recs: Sequence[Recommendation], rec: int, current: int, *, up_window_s: float, down_window_s: float,
    now: float,
) -> tuple[int, tuple[Recommendation, ...]]:
    """`PodAutoscalerReconciler.stabilizeRecommendation` (KPA and APA): the recommendation joins the history;
    a scale-up takes the highest recommendation of the scale-up cooldown window (0 s by default: this one), a
    scale-down the LOWEST of the scale-down window (300 s) — the opposite of Kubernetes' HPA, which keeps the
    highest so that a scale-down waits. Recommendations older than the longer window are dropped."""
    history = (*recs, (rec, now))
    keep = max(up_window_s, down_window_s)
    history = tuple((r, t) for r, t in history if t > now - keep)
    if rec == current:
        return current, history
    window, pick = (up_window_s, max) if rec > current else (down_window_s, min)
    inside = [r for r, t in history if t > now - window]
    return (pick(inside) if inside else rec), history


@dataclass(frozen=True, slots=True)
class AibrixApaState:
    samples: tuple[tuple[float, float], ...] = ()  # the stable window: (time, mean per-pod value)
    recommendations: tuple[Recommendation, ...] = ()


@dataclass(frozen=True, slots=True)
class AibrixApa:
    """AIBrix's APA (v0.7.0), with a per-pod metric of requests/s and a target of C:

    - every `sync_period_s` 10 (the controller's resync), each pod's metric is fetched from the pod; a pod
      still loading its model serves no metrics and is left out, so the snapshot is the mean over the ready
      pods. The snapshots of the last `stable_window_s` 180 (`observeWindowSeconds` default) are averaged.
    - the current count is the scale target's `spec.replicas`, loading pods included: desired =
      ceil(replicas x per-pod use / target) outside the tolerances (up 0.1, down 0.1), at most doubled and at
      least halved per decision (`maxScaleUpRate`, `maxScaleDownRate` 2).
    - then the cooldown (`stabilizeRecommendation`): scale-up 0 s, scale-down 300 s taking the lowest
      recommendation of the window; then min/max. No scale to zero (`scaleToZero` false by default).
    - a per-pod rate is not a gauge the pod keeps; here it is the pod's share of the last sync period's
      requests.
    """

    target_rps_per_replica: float
    min_replicas: int = 1
    max_replicas: int = 200
    up_fluctuation_tolerance: float = 0.1
    down_fluctuation_tolerance: float = 0.1
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    stable_window_s: float = 180.0
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 300.0
    sync_period_s: float = 10.0
    name: str = "aibrix-apa"

    @property
    def period_s(self) -> float:
        return self.sync_period_s

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return (Pipeline("direct", self.sync_period_s),)

    def initial_state(self) -> AibrixApaState:
        return AibrixApaState()

    def decide(self, obs: Observation, state: AibrixApaState) -> tuple[int, AibrixApaState]:
        now, current = obs.now_s, obs.total
        # computeScaleDecision's boundary checks come before any metric
        if current == 0 and self.min_replicas != 0:
            return 0, state
        if current > self.max_replicas:
            return self.max_replicas, state
        if current < self.min_replicas:
            return self.min_replicas, state
        if obs.ready == 0 or math.isnan(obs.metric_rps):
            return current, state  # no pod answered: the snapshot is an error, nothing is scaled
        # TimeWindow: one value per 1 s bucket, buckets older than the window dropped
        samples = tuple((t, v) for t, v in state.samples if math.floor(t) >= math.floor(now - self.stable_window_s))
        samples = (*(s for s in samples if math.floor(s[0]) != math.floor(now)), (now, obs.metric_rps / obs.ready))
        stable = sum(v for _, v in samples) / len(samples)
        rec = apa_compute_target_replicas(
            current, stable, self.target_rps_per_replica, up_tolerance=self.up_fluctuation_tolerance,
            down_tolerance=self.down_fluctuation_tolerance, max_scale_up_rate=self.max_scale_up_rate,
            max_scale_down_rate=self.max_scale_down_rate)
        rec = min(max(rec, self.min_replicas), self.max_replicas)
        desired, recs = aibrix_stabilize(state.recommendations, rec, current, up_window_s=self.scale_up_cooldown_s,
                                         down_window_s=self.scale_down_cooldown_s, now=now)
        return min(max(desired, self.min_replicas), self.max_replicas), AibrixApaState(samples, recs)


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
