"""The Kubernetes HPA (autoscaling/v2) as the simulator runs it (see `infer_ctl.sim.autoscaler`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from infer_ctl.sim.autoscaler import Observation, Pipeline

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
