"""The peers' own test cases, replayed through the simulator's re-implementations (infer_ctl.sim.policies).

One test per upstream case; each carries the repository, file, test function and case name it comes from. The
upstream sources were read at these versions:

- Kubernetes v1.37.2 (k8s.io/kubernetes, pkg/controller/podautoscaler/replica_calculator_test.go and
  horizontal_test.go). Go counts metric values as integer milli-units and truncates an average; the port works
  in floats, so an expected usage is compared after the same truncation (or the rounding up the code does).
- Knative Serving knative-v1.23.0 (pkg/autoscaler/scaling/autoscaler_test.go: the decider;
  pkg/reconciler/autoscaling/kpa/scaler_test.go: the reconciler's scale-to-zero, with that file's constants
  stableWindow 5 min and gracePeriod 60 s). The tests' "concurrency" metric and "rps" metric go through the same
  arithmetic; the port's metric is a total requests/s with target value = `target_rps_per_replica` x
  `target_utilization` (set to 1.0 here, as the tests give the target value directly).
- KEDA v2.20.2 (kedacore/keda, pkg/scaling/executor/scale_scaledobjects_test.go) and the ScaledObject
  documentation (pollingInterval, cooldownPeriod, activationThreshold, minReplicaCount; the Prometheus scaler's
  `val > activationThreshold`, pkg/scalers/prometheus_scaler.go).
- Ray Serve 2.60.0 (python/ray/serve/tests/test_autoscaling_policy.py, the version whose policy is
  `_apply_autoscaling_config(replica_queue_length_autoscaling_policy)`). Upstream counts control-loop periods of
  0.1 s (`CONTROL_LOOP_INTERVAL_S`); the port takes the time, so each period here advances `now` by 0.1 s.
- AIBrix v0.7.0 (vllm-project/aibrix, pkg/controller/podautoscaler/algorithm/apa_test.go). The controller's
  cooldown (`stabilizeRecommendation`) has no upstream test; the cases for it below are read from the source
  and say so.

Upstream cases that do not apply, and why:

- Kubernetes: the Resource (CPU/memory utilization) and ContainerResource cases (TestReplicaCalcResourceScale,
  TestReplicaCalcResourceTolerance, the CPU readiness and initialisation-period cases of TestGroupPods and
  TestReplicaCalcResourceMissingMetrics, and those of its cases whose target is not 100 %, where a missing Pod
  is filled at max(100 %, target) of its request instead of at the target): the simulated services scale on a
  request rate, not on CPU. The missing-metric cases at a 100 % target with equal requests are the Pods-metric
  arithmetic and are ported. Object metrics (TestReplicaCalcObjectMetric, TestReplicaCalcObjectPerPodMetric) and
  External metrics with a Value target (TestReplicaCalcExternalMetric): no simulated peer uses them. The int64
  and int32 overflow cases: Python numbers do not overflow and replicas are bounded by maxReplicas.
  "superfluous metrics counted" and "disjoint pod and metric names": the simulator has one source for Pods and
  their metrics. The full-controller tests of horizontal_test.go (fake clients, conditions, events, status,
  selectors, conflicts, monitor labels) except the four adapted below: they test the API plumbing.
- Knative: excess burst capacity, the activator count and the metrics emitted (TestAutoscalerMetrics*,
  TestAutoscalerStartMetrics, the EBC half of every case): the simulator routes every request to the ready
  pods and the activator's placement does not change a replica count. TestCantCountPods and TestNewFail: the
  pod count cannot fail in the simulator. Reconciler cases on the activation timeout, the last-pod retention,
  unreachable revisions, the SKS proxy mode and probes, and initial scale: the simulator runs one reachable
  revision of a service already running, with the default retention of 0.
- KEDA: idleReplicaCount, the pause and force-activation annotations, fallback, and the HPA health conditions
  (TestScaleToIdleReplicasWhenNotActive, TestScaleFromIdleToMinReplicasWhenActive, TestScaleToPausedReplicasCount,
  TestNoScale*Annotation*, TestScaleFromMinReplicasWhenActivationForced, TestGetHPAHealth_*, TestRequestScale_*,
  TestEventWitTriggerInfo): not used by the simulated ScaledObject.
- Ray Serve: test_callable_and_direct_values (lazy context fields), the application-level policy tests and the
  custom-policy and Prometheus-policy tests: the simulator runs the default deployment-level policy only.
- AIBrix: the "division_by_zero" case is ported (a target of 0 keeps the count); the KPA and HPA strategies of
  AIBrix are not simulated (Knative's KPA and Kubernetes' HPA are, from their own sources).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from infer_ctl.sim.autoscaler import Observation
from infer_ctl.sim.hpa import (
    Hpa,
    HpaBehavior,
    HpaMetricError,
    HpaScalingPolicy,
    HpaScalingRules,
    HpaState,
    PodSample,
    ScaleEvent,
    Tolerances,
    hpa_convert_with_behavior_rate,
    hpa_convert_with_rules,
    hpa_external_per_pod_replicas,
    hpa_group_pods,
    hpa_pod_metric_replicas,
    hpa_replicas_change_per_period,
    hpa_scale_down_limit,
    hpa_scale_down_rules,
    hpa_scale_up_limit,
    hpa_scale_up_rules,
    hpa_stabilize,
    hpa_stabilize_with_behaviors,
    hpa_store_scale_event,
)
from infer_ctl.sim.peers import (
    AibrixApa,
    AibrixApaState,
    Keda,
    KedaState,
    Kpa,
    KpaState,
    RayServe,
    RayServeState,
    aibrix_stabilize,
    apa_compute_target_replicas,
    keda_request_scale,
    kpa_new_decider,
    kpa_reconcile_scale,
    kpa_scale,
    ray_apply_delay_logic,
    ray_apply_scaling_factors,
    ray_serve_policy,
)

NOW = 10_000.0  # an arbitrary "time.Now()" for the cases that place events relative to it


# === Kubernetes HPA: replica_calculator_test.go ===================================================================


def pods(*metrics: float | None, phases: tuple[str, ...] = ()) -> list[PodSample]:
    return [PodSample(f"pod-{i}", m, phases[i] if i < len(phases) else "Running") for i, m in enumerate(metrics)]


DEFAULT_TOL = Tolerances(0.1, 0.1)
UP_1_PERCENT = Tolerances(0.1, 0.01)  # `&Tolerances{defaultTestingTolerance, .01}`


# kubernetes/kubernetes v1.37.2, pkg/controller/podautoscaler/replica_calculator_test.go, TestReplicaCalcPodMetric
# (GetMetricReplicas: a Pods metric). The "hot-CPU"/"unready" cases set Pod readiness, which a non-CPU metric
# ignores: those Pods count as ready, exactly as upstream expects.
@pytest.mark.parametrize(
    ("current", "metrics", "target", "tolerances", "want_replicas", "want_usage"),
    [
        pytest.param(3, pods(20000, 10000, 30000), 15000, DEFAULT_TOL, 4, 20000, id="scale up"),
        pytest.param(3, pods(50000, 10000, 30000), 15000, DEFAULT_TOL, 6, 30000,
                     id="scale up: unready hot-CPU pod scales less"),
        pytest.param(3, pods(50000, 15000, 30000), 15000, DEFAULT_TOL, 7, 31666,
                     id="scale up: unready hot-CPU pods avoid scale-down"),
        pytest.param(5, pods(12000, 12000, 12000, 12000, 12000), 20000, DEFAULT_TOL, 3, 12000, id="scale down"),
        pytest.param(3, pods(20000, 21000, 21000), 20000, DEFAULT_TOL, 3, 20666, id="within default tolerance"),
        pytest.param(3, pods(20000, 21000, 21000), 20000, UP_1_PERCENT, 4, 20666,
                     id="outside configurable 1% tolerance"),
        pytest.param(5, pods(20000, 19000, 21000, None, None), 20000, DEFAULT_TOL, 5, 20000,
                     id="no change: missing metrics"),
        pytest.param(2, pods(10000, 10000, None), 17000, DEFAULT_TOL, 2, 10000,
                     id="rolling update with maxSurge: extra pod missing metric"),
    ],
)
def test_hpa_pod_metric_replicas_match_upstream(
    *, current: int, metrics: list[PodSample], target: float, tolerances: Tolerances, want_replicas: int,
    want_usage: int,
) -> None:
    replicas, usage = hpa_pod_metric_replicas(current, target, metrics, tolerances)
    assert replicas == want_replicas
    assert math.floor(usage) == want_usage  # Go's integer average


# kubernetes/kubernetes v1.37.2, replica_calculator_test.go, TestReplicaCalcResourceMissingMetrics: the cases at a
# 100 % CPU target with 1.0-core requests, i.e. a Pods metric with a target of 1000 milli-cores per Pod (a missing
# Pod is then filled at its request, which is the target, as the Pods path does).
@pytest.mark.parametrize(
    ("current", "metrics", "want_replicas"),
    [
        pytest.param(4, pods(400, 95, None, None), 3, id="some pods missing metrics scales down"),
        pytest.param(2, pods(1000, None), 2, id="no change: metric equal to target"),
        pytest.param(2, pods(1900, None), 2, id="no change: metric above target"),
        pytest.param(2, pods(600, None), 2, id="no change: metric below target"),
    ],
)
def test_hpa_missing_metrics_at_a_full_target_match_upstream(
    current: int, metrics: list[PodSample], want_replicas: int
) -> None:
    assert hpa_pod_metric_replicas(current, 1000.0, metrics)[0] == want_replicas


# kubernetes/kubernetes v1.37.2, replica_calculator_test.go, TestReplicaCalcResourceMissingMetrics case
# "no metrics returned from metrics API" (an error, and the controller does not rescale)
def test_hpa_with_no_metric_for_any_pod_is_an_error() -> None:
    with pytest.raises(HpaMetricError, match="did not receive metrics"):
        hpa_pod_metric_replicas(4, 1000.0, pods(None, None, None))


# kubernetes/kubernetes v1.37.2, replica_calculator_test.go, TestGroupPods: the cases that do not depend on CPU
@pytest.mark.parametrize(
    ("samples", "want"),
    [
        pytest.param([], (0, set(), set(), set()), id="void"),
        pytest.param([PodSample("bentham", 1000, "Succeeded")], (1, set(), set(), set()),
                     id="count in a ready pod - memory"),
        pytest.param([PodSample("epicurus", None, "Succeeded")], (0, set(), {"epicurus"}, set()), id="a missing pod"),
        pytest.param([PodSample("unscheduled", None, "Pending")], (0, {"unscheduled"}, set(), set()),
                     id="pending pods are unreadied"),
        pytest.param([PodSample("deleted", 1, "Pending", deleting=True)], (0, set(), set(), {"deleted"}),
                     id="ignore pods with deletion timestamps"),
        pytest.param([PodSample("failed", 1, "Failed")], (0, set(), set(), {"failed"}),
                     id="ignore pods in a failed state"),
    ],
)
def test_hpa_group_pods_matches_upstream(samples: list[PodSample], want: tuple[int, set[str], set[str], set[str]]
                                         ) -> None:
    assert hpa_group_pods(samples) == want


# kubernetes/kubernetes v1.37.2, replica_calculator_test.go, TestReplicaCalcExternalPerPodMetric
# (GetExternalPerPodMetricReplicas, what KEDA's HPA runs); the usage per Pod is rounded up as upstream does
@pytest.mark.parametrize(
    ("current", "usage", "target", "tolerances", "want_replicas", "want_usage"),
    [
        pytest.param(3, 8600, 2150, DEFAULT_TOL, 4, 2867, id="scale up"),
        pytest.param(5, 8600, 2867, DEFAULT_TOL, 3, 1720, id="scale down"),
        pytest.param(3, 8600, 2900, DEFAULT_TOL, 3, 2867, id="within default tolerance"),
        pytest.param(3, 8600, 2800, UP_1_PERCENT, 4, 2867, id="outside configurable 1% tolerance"),
    ],
)
def test_hpa_external_per_pod_replicas_match_upstream(
    *, current: int, usage: float, target: float, tolerances: Tolerances, want_replicas: int, want_usage: int
) -> None:
    replicas, per_pod = hpa_external_per_pod_replicas(current, target, usage, tolerances)
    assert replicas == want_replicas
    assert math.ceil(per_pod) == want_usage


# === Kubernetes HPA: horizontal_test.go ===========================================================================


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestConvertDesiredReplicasWithRules (an HPA without behavior)
@pytest.mark.parametrize(
    ("current", "desired", "lo", "hi", "want", "condition"),
    [
        pytest.param(5, 7, 3, 8, 7, "DesiredWithinRange", id="prenormalized desired replicas within range"),
        pytest.param(3, 1, 2, 8, 2, "TooFewReplicas", id="prenormalized desired replicas < minReplicas"),
        pytest.param(1, 0, 0, 10, 0, "DesiredWithinRange", id="prenormalized desired zeroed replicas within range"),
        pytest.param(20, 1000, 1, 10, 10, "TooManyReplicas",
                     id="maxReplicas is the limit because maxReplicas < scaleUpLimit"),
        pytest.param(3, 1000, 1, 2000, 6, "ScaleUpLimit",
                     id="scaleUpLimit is the limit because scaleUpLimit < maxReplicas"),
    ],
)
def test_hpa_convert_with_rules_matches_upstream(
    *, current: int, desired: int, lo: int, hi: int, want: int, condition: str
) -> None:
    assert hpa_convert_with_rules(current, desired, lo, hi) == (want, condition)


def rules(pods_value: int, pods_period: float, percent: int, percent_period: float, window: float
          ) -> HpaScalingRules:
    """horizontal_test.go `generateScalingRules`: Max of the non-zero policies."""
    policies = []
    if pods_value:
        policies.append(HpaScalingPolicy("Pods", pods_value, pods_period))
    if percent:
        policies.append(HpaScalingPolicy("Percent", percent, percent_period))
    return HpaScalingRules(window, "Max", tuple(policies))


def events(changes: list[int], period_s: float) -> tuple[ScaleEvent, ...]:
    """horizontal_test.go `generateEventsUniformDistribution`: each event at the middle of its segment of the
    last `period_s`. E.g. [1, 5, 9] over 120 s: 100, 60 and 20 s ago."""
    seg = period_s / len(changes)
    return tuple(ScaleEvent(c, NOW - (period_s - seg * (i + 1) + seg / 2)) for i, c in enumerate(changes))


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestCalculateScaleUpLimitWithScalingRules
def test_hpa_scale_up_limit_with_a_min_select_policy_matches_upstream() -> None:
    r = HpaScalingRules(300, "Min", (HpaScalingPolicy("Pods", 2, 60), HpaScalingPolicy("Percent", 50, 60)))
    assert hpa_scale_up_limit(1, (), (), r, NOW) == 2


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestCalculateScaleDownLimitWithBehaviors
def test_hpa_scale_down_limit_with_a_min_select_policy_matches_upstream() -> None:
    r = HpaScalingRules(300, "Min", (HpaScalingPolicy("Pods", 2, 60), HpaScalingPolicy("Percent", 50, 60)))
    assert hpa_scale_down_limit(5, (), (), r, NOW) == 3


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestScalingWithRules (convertDesiredReplicasWithBehaviorRate;
# rules None take the API defaults, GenerateHPAScaleUpRules / GenerateHPAScaleDownRules)
SCALING_WITH_RULES = [
    # name, up events, down events, min, max, up rules, down rules, current, desired, want, condition
    ("prenormalized desired replicas within range", (), (), 3, 8, None, None, 5, 7, 7, "DesiredWithinRange"),
    ("prenormalized desired replicas < minReplicas", (), (), 2, 8, None, None, 3, 1, 2, "TooFewReplicas"),
    ("prenormalized desired replicas within range when minReplicas is 0", (), (), 0, 10, None, None, 1, 0, 0,
     "DesiredWithinRange"),
    ("maxReplicas is the limit because maxReplicas < scaleUpLimit", (), (), 1, 10, None, None, 20, 1000, 10,
     "TooManyReplicas"),
    ("desired replica count is more than the maximum replica count", (), (), 100, 150, None, None, 100, 1000, 150,
     "TooManyReplicas"),
    ("scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies", (), (), 1, 2000,
     rules(0, 0, 1, 60, 0), None, 3, 1000, 4, "ScaleUpLimit"),
    ("scaleUp with default behavior", (), (), 1, 1000, None, None, 10, 50, 20, "ScaleUpLimit"),
    ("scaleUp with pods policy larger than percent policy", (), (), 1, 1000, rules(100, 60, 100, 60, 0), None, 10,
     500, 110, "ScaleUpLimit"),
    ("scaleUp with percent policy larger than pods policy", (), (), 1, 1000, rules(2, 60, 100, 60, 0), None, 10,
     500, 20, "ScaleUpLimit"),
    ("scaleUp with spec MaxReplicas limitation with large pod policy", (), (), 1, 1000, rules(100, 60, 0, 0, 0),
     None, 10, 50, 50, "DesiredWithinRange"),
    ("scaleUp with spec MaxReplicas limitation with large percent policy", (), (), 1, 1000,
     rules(10000, 60, 0, 0, 0), None, 10, 50, 50, "DesiredWithinRange"),
    ("scaleUp with pod policy limitation", (), (), 1, 1000, rules(30, 60, 0, 0, 0), None, 10, 50, 40,
     "ScaleUpLimit"),
    ("scaleUp with percent policy limitation", (), (), 1, 1000, rules(0, 0, 200, 60, 0), None, 10, 50, 30,
     "ScaleUpLimit"),
    ("scaleDown with percent policy larger than pod policy", (), (), 1, 1000, None, rules(20, 60, 1, 60, 300), 100,
     2, 80, "ScaleDownLimit"),
    ("scaleDown with pod policy larger than percent policy", (), (), 1, 1000, None, rules(2, 60, 1, 60, 300), 100,
     2, 98, "ScaleDownLimit"),
    ("scaleDown with spec MinReplicas limitation with large pod policy", (), (), 1, 1000, None,
     rules(100, 60, 0, 0, 300), 10, 0, 1, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large percent policy", (), (), 5, 1000, None,
     rules(0, 0, 100, 60, 300), 10, 2, 5, "TooFewReplicas"),
    ("scaleDown with pod policy limitation", (), (), 1, 1000, None, rules(5, 60, 0, 0, 300), 10, 2, 5,
     "ScaleDownLimit"),
    ("scaleDown with percent policy limitation", (), (), 1, 1000, None, rules(0, 0, 50, 60, 300), 10, 5, 5,
     "DesiredWithinRange"),
    ("scaleUp with spec MaxReplicas limitation with large pod policy and events", events([1, 5, 9], 120), (), 1,
     200, rules(300, 60, 0, 0, 0), None, 100, 500, 200, "TooManyReplicas"),
    ("scaleUp with spec MaxReplicas limitation with large percent policy and events", events([1, 5, 9], 120), (),
     1, 200, rules(0, 0, 10000, 60, 0), None, 100, 500, 200, "TooManyReplicas"),
    ("scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up events",
     events([1, 5, 9], 120), (), 1, 1000, rules(5, 120, 0, 0, 0), None, 100, 500, 100, "ScaleUpLimit"),
    ("scaleUp with pod policy and previous scale up events", events([1, 5, 9], 120), (), 1, 1000,
     rules(150, 120, 0, 0, 0), None, 100, 500, 235, "ScaleUpLimit"),
    ("scaleUp with percent policy and previous scale up events", events([1, 5, 9], 120), (), 1, 1000,
     rules(0, 0, 200, 120, 0), None, 100, 500, 255, "ScaleUpLimit"),
    ("scaleUp with percent policy and previous scale up and down events", events([4], 120), events([2], 120), 1,
     1000, rules(0, 0, 300, 300, 0), None, 6, 24, 16, "ScaleUpLimit"),
    ("scaleDown with default policy and previous events", (), events([1, 5, 9], 120), 1, 1000, None, None, 10, 5,
     5, "DesiredWithinRange"),
    ("scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events", (),
     events([1, 5, 9], 120), 1, 1000, None, rules(115, 120, 0, 0, 300), 100, 0, 1, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large pod policy and previous events", (),
     events([1, 5, 9], 120), 5, 1000, None, rules(130, 120, 0, 0, 300), 100, 0, 5, "TooFewReplicas"),
    ("scaleDown with spec MinReplicas limitation with large percent policy and previous events", (),
     events([1, 5, 9], 120), 5, 1000, None, rules(0, 0, 100, 120, 300), 100, 2, 5, "TooFewReplicas"),
    ("scaleDown with pod policy limitation and previous events", (), events([1, 5, 9], 120), 1, 1000, None,
     rules(5, 120, 0, 0, 300), 100, 2, 100, "ScaleDownLimit"),
    ("scaleDown with percent policy limitation and previous events", (), events([2, 4, 6], 120), 1, 1000, None,
     rules(0, 0, 50, 120, 300), 100, 0, 56, "ScaleDownLimit"),
    ("scaleDown with percent policy and previous scale up and down events", events([2], 120), events([4], 120), 1,
     1000, None, rules(0, 0, 50, 180, 0), 10, 1, 6, "ScaleDownLimit"),
    ("scaleDown with previous events preventing further scale down", (), events([10, 10, 10], 120), 1, 1000, None,
     rules(0, 0, 10, 120, 300), 100, 0, 100, "ScaleDownLimit"),
    ("scaleDown with with previous events still allowing more scale down", (), events([10, 10, 10], 120), 1, 1000,
     None, rules(0, 0, 1000, 120, 300), 10, 5, 5, "DesiredWithinRange"),
    ("check 'outdated' flag for events for one behavior for up", events([8, 12, 9, 11], 120), (), 1, 1000,
     rules(1000, 60, 0, 0, 0), None, 100, 200, 200, "DesiredWithinRange"),
    ("check that events were not marked 'outdated' for two different policies in the behavior for up",
     events([8, 12, 9, 11], 120), (), 1, 1000, rules(1000, 120, 100, 60, 0), None, 100, 200, 200,
     "DesiredWithinRange"),
    ("check that events were marked 'outdated' for two different policies in the behavior for up",
     events([8, 12, 9, 11], 120), (), 1, 1000, rules(1000, 30, 100, 60, 0), None, 100, 200, 200,
     "DesiredWithinRange"),
    ("check 'outdated' flag for events for one behavior for down", (), events([8, 12, 9, 11], 120), 1, 1000, None,
     rules(1000, 60, 0, 0, 300), 100, 5, 5, "DesiredWithinRange"),
    ("check that events were not marked 'outdated' for two different policies in the behavior for down", (),
     events([8, 12, 9, 11], 120), 1, 1000, None, rules(1000, 120, 100, 60, 300), 100, 5, 5, "DesiredWithinRange"),
    ("check that events were marked 'outdated' for two different policies in the behavior for down", (),
     events([8, 12, 9, 11], 120), 1, 1000, None, rules(1000, 30, 100, 60, 300), 100, 5, 5, "DesiredWithinRange"),
]


@pytest.mark.parametrize(
    ("up", "down", "lo", "hi", "up_rules", "down_rules", "current", "desired", "want", "condition"),
    [pytest.param(*case[1:], id=case[0]) for case in SCALING_WITH_RULES],
)
def test_hpa_convert_with_behavior_rate_matches_upstream(
    *, up: tuple[ScaleEvent, ...], down: tuple[ScaleEvent, ...], lo: int, hi: int, up_rules: HpaScalingRules | None,
    down_rules: HpaScalingRules | None, current: int, desired: int, want: int, condition: str,
) -> None:
    got = hpa_convert_with_behavior_rate(
        current, desired, min_replicas=lo, max_replicas=hi, up=up, down=down, up_rules=hpa_scale_up_rules(up_rules),
        down_rules=hpa_scale_down_rules(down_rules), now=NOW)
    assert got == (want, condition)


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestNormalizeDesiredReplicas (stabilizeRecommendation, a 5-minute
# downscale stabilization window): the stabilized count and the length of the recommendation log after it
@pytest.mark.parametrize(
    ("recs", "desired", "want", "want_len"),
    [
        pytest.param((), 5, 5, 1, id="empty log"),
        pytest.param(((4, NOW - 120), (5, NOW - 60)), 3, 5, 3, id="stabilize"),
        pytest.param(((1, NOW - 120), (2, NOW - 60)), 3, 3, 3, id="no stabilize"),
        pytest.param(((10, NOW - 600), (9, NOW - 540)), 3, 3, 2, id="no stabilize - old recommendations"),
        pytest.param(((10, NOW - 600), (4, NOW - 60), (5, NOW - 120), (9, NOW - 540)), 3, 5, 4,
                     id="stabilize - old recommendations"),
    ],
)
def test_hpa_stabilize_matches_upstream(
    recs: tuple[tuple[int, float], ...], desired: int, want: int, want_len: int
) -> None:
    got, log = hpa_stabilize(recs, desired, 300.0, NOW)
    assert (got, len(log)) == (want, want_len)


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestNormalizeDesiredReplicasWithBehavior
# (stabilizeRecommendationWithBehaviors): the stabilized count and the recommendations kept
BEHAVIOR_STABILIZATION = [
    ("empty recommendations for scaling down", (), 100, 5, 0, 0, 5, [5]),
    ("simple scale down stabilization", ((4, NOW - 120), (5, NOW - 60)), 100, 3, 0, 180, 5, [4, 5, 3]),
    ("simple scale up stabilization", ((4, NOW - 120), (5, NOW - 60)), 1, 7, 300, 0, 4, [4, 5, 7]),
    ("no scale down stabilization", ((1, NOW - 120), (2, NOW - 60)), 100, 3, 300, 0, 3, [1, 2, 3]),
    ("no scale up stabilization", ((4, NOW - 120), (5, NOW - 60)), 1, 3, 0, 300, 3, [4, 5, 3]),
    ("no scale down stabilization, reuse recommendation element", ((10, NOW - 600), (9, NOW - 540)), 100, 3, 0, 0,
     3, [10, 3]),
    ("no scale up stabilization, reuse recommendation element", ((10, NOW - 600), (9, NOW - 540)), 1, 100, 0, 0,
     100, [10, 100]),
    ("scale down stabilization, reuse one of obsolete recommendation element",
     ((10, NOW - 600), (4, NOW - 60), (5, NOW - 120), (9, NOW - 540)), 100, 3, 0, 180, 5, [10, 4, 5, 3]),
    ("scale up stabilization, reuse one of obsolete recommendation element",
     ((10, NOW - 6000), (6, NOW - 60), (5, NOW - 120), (9, NOW - 180)), 1, 100, 300, 0, 5, [100, 6, 5, 9]),
    ("scale up and down stabilization, do not scale up when prenormalized rec goes down",
     ((2, NOW - 6000), (3, NOW - 180)), 2, 1, 300, 300, 2, None),
    ("scale up and down stabilization, do not scale down when prenormalized rec goes up",
     ((2, NOW - 6000), (1, NOW - 180)), 2, 3, 300, 300, 2, None),
]


@pytest.mark.parametrize(
    ("recs", "current", "desired", "up_window", "down_window", "want", "want_recs"),
    [pytest.param(*case[1:], id=case[0]) for case in BEHAVIOR_STABILIZATION],
)
def test_hpa_stabilize_with_behaviors_matches_upstream(
    *, recs: tuple[tuple[int, float], ...], current: int, desired: int, up_window: float, down_window: float, want: int,
    want_recs: list[int] | None,
) -> None:
    got, log = hpa_stabilize_with_behaviors(recs, desired, current, up_window_s=up_window, down_window_s=down_window,
                                            now=NOW)
    assert got == want
    if want_recs is not None:
        assert [r for r, _ in log] == want_recs


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestStoreScaleEvents: the replicas changed in the last 60 s
# before the new event, and the events kept after it (change, outdated); "with default behavior" and "without
# behavior" store nothing upstream (storeScaleEvent returns at once without a behavior), which `Hpa.reconcile`
# does by not calling it
STORE_SCALE_EVENTS = [
    ("empty entries with two-policy-behavior", (), rules(10, 60, 100, 60, 0), 0, [(5, False)]),
    ("one outdated entry to be replaced with behavior", ((7, 61),), rules(10, 60, 100, 60, 0), 0, [(5, False)]),
    ("one actual entry to be not touched with behavior", ((7, 58),), rules(10, 60, 100, 60, 0), 7,
     [(7, False), (5, False)]),
    ("two entries, one of them to be replaced", ((7, 61), (6, 59)), rules(10, 60, 0, 0, 0), 6,
     [(5, False), (6, False)]),
    ("replace one entry, use policies with different periods", ((8, 29), (6, 59), (7, 61), (9, 61)),
     rules(10, 60, 100, 30, 0), 14, [(8, False), (6, False), (7, True), (5, False)]),
    ("two entries, both actual", ((7, 58), (6, 59)), rules(10, 120, 100, 30, 0), 13,
     [(7, False), (6, False), (5, False)]),
]


@pytest.mark.parametrize(
    ("prev", "scaling_rules", "want_change", "want_events"),
    [pytest.param(*case[1:], id=case[0]) for case in STORE_SCALE_EVENTS],
)
def test_hpa_store_scale_event_matches_upstream(
    prev: tuple[tuple[int, float], ...], scaling_rules: HpaScalingRules, want_change: int,
    want_events: list[tuple[int, bool]],
) -> None:
    before = tuple(ScaleEvent(c, NOW - ago) for c, ago in prev)
    assert hpa_replicas_change_per_period(60, before, NOW) == want_change
    after = hpa_store_scale_event(before, 5, scaling_rules, NOW)
    assert [(e.change, e.outdated) for e in after] == want_events


def hpa_obs(now: float, ready: int, per_pod: float, loading: int = 0) -> Observation:
    return Observation(now, ready, loading, per_pod * ready)


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestScaleDownStabilizeInitialSize: a new HPA (no
# recommendations) at 5 replicas whose metric wants 3 stays at 5 (recordInitialRecommendation). Upstream: CPU at
# 28 % of a 50 % target over 5 Pods; here the same ratio on a Pods metric.
def test_a_new_hpa_does_not_scale_down_below_its_initial_size() -> None:
    hpa = Hpa(50.0, 2, 6)
    n, state = hpa.decide(hpa_obs(NOW, 5, 28.0), HpaState())
    assert n == 5
    assert state.recommendations is not None and state.recommendations[0] == (5, NOW)


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestStabilizeDownscale: recommendations 10 (10 minutes ago)
# and 4 (1 minute ago), 4 replicas, a metric wanting 2 (CPU 50 % of a 100 % target): stays at 4
def test_the_hpa_keeps_the_highest_recommendation_of_the_last_five_minutes() -> None:
    hpa = Hpa(100.0, 1, 5)
    n, _ = hpa.decide(hpa_obs(NOW, 4, 50.0), HpaState(((10, NOW - 600), (4, NOW - 60))))
    assert n == 4


# kubernetes/kubernetes v1.37.2, horizontal_test.go, TestUpscaleCap and TestUpscaleCapGreaterThanMaxReplicas:
# a scale-up behavior of 700 % per 60 s from 3 replicas at 20x the target: 24, or maxReplicas 20
@pytest.mark.parametrize(("max_replicas", "want"), [pytest.param(100, 24, id="TestUpscaleCap"),
                                                    pytest.param(20, 20, id="TestUpscaleCapGreaterThanMaxReplicas")])
def test_the_hpa_scale_up_rate_caps_a_large_jump(max_replicas: int, want: int) -> None:
    hpa = Hpa(10.0, 1, max_replicas, behavior=HpaBehavior(scale_up=rules(0, 0, 700, 60, 0)))
    n, state = hpa.decide(hpa_obs(NOW, 3, 200.0), HpaState())
    assert n == want
    assert [e.change for e in state.scale_up_events] == [want - 3]


# === Knative KPA: autoscaler_test.go ==============================================================================


def knative(target: float, **kw: float | bool) -> Kpa:
    """autoscaler_test.go `newTestAutoscaler`: the target value given directly, rates 10, panic threshold 2, a
    60 s stable window."""
    params: dict[str, float | bool] = {"target_utilization": 1.0, "max_scale_up_rate": 10.0,
                                       "max_scale_down_rate": 10.0, "panic_threshold": 2.0, "stable_window_s": 60.0}
    params.update(kw)
    return Kpa(target, 0, 0, **params)  # type: ignore[arg-type]


def scale(kpa: Kpa, state: KpaState, ready: int, stable: float, panic: float, now: float  # noqa: PLR0917
          ) -> tuple[int | None, KpaState]:
    return kpa_scale(kpa, state, ready, stable_rps=stable, panic_rps=panic, now=now)


# knative/serving knative-v1.23.0, pkg/autoscaler/scaling/autoscaler_test.go, TestAutoscalerScaleDownDelay
# (subtests "simple" and "gradual", which run one after the other on one autoscaler)
def test_kpa_scale_down_delay_holds_the_highest_count_of_the_delay() -> None:
    kpa = knative(10, panic_threshold=100, scale_down_delay_s=300)
    st = kpa_new_decider(0, 0.0)
    steps = [(2, 40, 4), (300, 0, 4), (302, 0, 0),  # simple
             (540, 40, 4), (600, 30, 4), (660, 0, 4), (840, 0, 3), (900, 0, 0)]  # gradual
    for t, metric, want in steps:
        n, st = scale(kpa, st, 0, metric, metric, t)
        assert n == want, t


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerScaleDownDelayNotReachable
def test_kpa_scale_down_delay_is_ignored_once_the_revision_is_unreachable() -> None:
    kpa = knative(10, panic_threshold=100, scale_down_delay_s=300)
    st = kpa_new_decider(0, 0.0)
    n, st = scale(kpa, st, 0, 40, 40, 2)
    assert n == 4
    n, st = scale(kpa, st, 0, 0, 0, 60)
    assert n == 4
    n, st = scale(replace(kpa, reachable=False), st, 0, 0, 0, 2)
    assert n == 0


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerScaleDownDelayZero
def test_kpa_without_a_scale_down_delay_scales_down_at_once() -> None:
    kpa = knative(10, panic_threshold=100)
    st = kpa_new_decider(0, 0.0)
    n, st = scale(kpa, st, 0, 40, 40, 0)
    assert n == 4
    n, st = scale(kpa, st, 0, 20, 20, 0.5)
    assert n == 2


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerNoDataNoAutoscale (ScaleValid false)
def test_kpa_with_no_metric_does_not_decide() -> None:
    kpa = knative(10)
    n, _ = scale(kpa, kpa_new_decider(1, 0.0), 1, math.nan, math.nan, 0)
    assert n is None


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerStableModeIncreaseWithConcurrencyDefault and
# TestAutoscalerStableModeIncreaseWithRPS
@pytest.mark.parametrize("first_panic", [pytest.param(10, id="TestAutoscalerStableModeIncreaseWithConcurrencyDefault"),
                                         pytest.param(50, id="TestAutoscalerStableModeIncreaseWithRPS")])
def test_kpa_stable_mode_follows_the_stable_window(first_panic: float) -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 50, first_panic, NOW)
    assert n == 5
    n, st = scale(kpa, st, 1, 100, 99 if first_panic == 50 else 10, NOW)
    assert n == 10


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerUnpanicAfterSlowIncrease
def test_kpa_unpanics_a_stable_window_after_the_threshold_was_last_crossed() -> None:
    kpa = knative(1)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 10, 11, 25, NOW)
    assert n == 25 and st.panic_since_s == NOW
    n, st = scale(kpa, st, 40, 30, 41, NOW + 30)
    assert n == 41 and st.panic_since_s == NOW
    n, st = scale(kpa, st, 55, 50, 56, NOW + 62)
    assert n == 50 and st.panic_since_s is None


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerExtendPanicWindow
def test_kpa_extends_the_panic_while_still_over_the_threshold() -> None:
    kpa = knative(1)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 10, 11, 25, NOW)
    assert n == 25
    n, st = scale(kpa, st, 40, 30, 80, NOW + 30)
    assert n == 80 and st.panic_since_s == NOW + 30


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerStableModeDecrease
def test_kpa_stable_mode_scales_down() -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 8, 100, 100, NOW)
    assert n == 10
    n, st = scale(kpa, st, 8, 50, 50, NOW)
    assert n == 5


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerStableModeNoTrafficScaleToZero
def test_kpa_decider_wants_zero_with_no_traffic() -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 1, 0, NOW)
    assert n == 1
    n, st = scale(kpa, st, 1, 0, 0, NOW)
    assert n == 0


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerActivationScale
def test_kpa_activation_scale_is_the_least_nonzero_count() -> None:
    kpa = knative(10, activation_scale=2)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 0, 0, NOW)
    assert n == 0
    n, st = scale(kpa, st, 1, 1, 0, NOW)
    assert n == 2


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerPanicModeExponentialTrackAndStabilize
def test_kpa_panic_tracks_an_exponential_increase() -> None:
    kpa = knative(1)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 6, 6, NOW)
    assert n == 6
    for ready, metric, t in [(6, 36, NOW + 1), (36, 216, NOW + 2), (216, 1296, NOW + 2)]:
        n, st = scale(kpa, st, ready, metric, metric, t)
        assert n == metric and st.panic_since_s == t
    n, st = scale(kpa, st, 1296, 1296, 1296, NOW + 3)
    assert n == 1296


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerScale (the desired counts; the EBC is not
# modelled): target, ready pods, stable, panic, a preparation (panic since 5 s with 5 max pods, or spec changes)
AUTOSCALER_SCALE = [
    ("AutoscalerNoDataAtZeroNoAutoscale", 10, 1, 0, 0, {}, None, 0),
    ("AutoscalerNoDataAtZeroNoAutoscaleWithExplicitEPs", 10, 1, 0, 0, {}, None, 0),
    ("AutoscalerStableModeUnlimitedTBC", 181, 1, 21, 26, {}, None, 1),
    ("Autoscaler0TBC", 10, 1, 50, 49, {}, None, 5),
    ("AutoscalerStableModeNoChange", 10, 1, 50, 50, {}, None, 5),
    ("AutoscalerPanicStableLargerThanPanic", 1, 5, 50, 30, {}, "panicking", 50),
    ("AutoscalerPanicStableLessThanPanic", 1, 5, 20, 30, {}, "panicking", 30),
    ("AutoscalerStableModeNoChangeAlreadyScaled", 10, 5, 50, 50, {}, None, 5),
    ("AutoscalerStableModeIncreaseWithSmallScaleUpRate", 1, 2, 3, 3.1, {"max_scale_up_rate": 1.1}, None, 3),
    ("AutoscalerStableModeDecreaseWithSmallScaleDownRate", 10, 100, 1, 1, {"max_scale_down_rate": 1.1}, None, 90),
    ("AutoscalerStableModeDecreaseNonReachable", 10, 100, 1, 1, {"max_scale_down_rate": 1.1, "reachable": False},
     None, 1),
    ("AutoscalerPanicModeDoublePodCount", 10, 1, 50, 100, {}, None, 10),
]


@pytest.mark.parametrize(
    ("target", "ready", "stable", "panic", "spec", "prep", "want"),
    [pytest.param(*case[1:], id=case[0]) for case in AUTOSCALER_SCALE],
)
def test_kpa_autoscaler_scale_table_matches_upstream(
    *, target: float, ready: int, stable: float, panic: float, spec: dict[str, float | bool], prep: str | None,
    want: int,
) -> None:
    kpa = knative(target, **spec)
    st = kpa_new_decider(1, NOW)  # newTestAutoscaler starts with one ready pod
    if prep == "panicking":
        st = replace(st, panic_since_s=NOW - 5, max_panic_pods=5)
    n, _ = scale(kpa, st, ready, stable, panic, NOW)
    assert n == want


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerPanicThenUnPanicScaleDown
def test_kpa_holds_the_panic_count_until_the_stable_window_has_passed() -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 100, 100, NOW)
    assert n == 10
    n, st = scale(kpa, st, 10, 100, 1000, NOW)
    assert n == 100
    n, st = scale(kpa, st, 10, 1, 1, NOW + 30)
    assert n == 100
    n, st = scale(kpa, st, 10, 1, 1, NOW + 61)
    assert n == 1


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerRateLimitScaleUp and
# TestAutoscalerRateLimitScaleDown
def test_kpa_rate_limits_relative_to_the_ready_pods() -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    assert scale(kpa, st, 1, 1000, 1001, NOW)[0] == 10
    assert scale(kpa, st, 10, 1000, 1001, NOW)[0] == 100
    st = kpa_new_decider(1, NOW)
    assert scale(kpa, st, 100, 1, 1, NOW)[0] == 10
    assert scale(kpa, st, 10, 1, 1, NOW)[0] == 1


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerUseOnePodAsMinimumIfEndpointsNotFound
def test_kpa_counts_one_pod_when_none_is_ready() -> None:
    kpa = knative(10)
    assert scale(kpa, kpa_new_decider(1, NOW), 0, 1000, 888, NOW)[0] == 10


# knative/serving knative-v1.23.0, autoscaler_test.go, TestAutoscalerUpdateTarget
def test_kpa_follows_a_new_target() -> None:
    kpa = knative(10)
    st = kpa_new_decider(1, NOW)
    n, st = scale(kpa, st, 1, 100, 101, NOW)
    assert n == 10
    n, st = scale(replace(kpa, target_rps_per_replica=1.0), st, 10, 100, 101, NOW)
    assert n == 100


# knative/serving knative-v1.23.0, autoscaler_test.go, TestStartInPanicMode
@pytest.mark.parametrize(("ready", "panicking"), [(0, False), (1, False), (2, True)])
def test_a_new_kpa_decider_starts_in_panic_above_one_ready_pod(ready: int, panicking: bool) -> None:
    st = kpa_new_decider(ready, NOW)
    assert (st.panic_since_s is not None) == panicking
    assert st.max_panic_pods == ready


# === Knative KPA: the reconciler's scale to zero (kpa/scaler_test.go) =============================================

RECONCILER = Kpa(1.0, 0, 0, stable_window_s=300.0, scale_to_zero_grace_s=60.0)  # scaler_test.go's constants


# knative/serving knative-v1.23.0, pkg/reconciler/autoscaling/kpa/scaler_test.go, TestScaler and TestDisableScaleToZero:
# replicas before, the decider's count (None: no metrics), min/max scale, the PodAutoscaler's Active condition and
# its age, whether scale to zero is enabled; the replicas applied (None: no patch) and the condition after
SCALER = [
    ("waits to scale to zero (just before idle period)", 1, 0, 0, 0, "active", 299, True, None, "active"),
    ("scale to 1 waiting for idle expires", 10, 0, 0, 0, "active", 299, True, 1, "active"),
    ("waits to scale to zero after idle period", 1, 0, 0, 0, "active", 300, True, None, "inactive"),
    ("scale to zero after grace period", 1, 0, 0, 0, "inactive", 60, True, 0, "inactive"),
    ("waits to scale to zero (just before grace period)", 1, 0, 0, 0, "inactive", 59, True, None, "inactive"),
    ("scale down to minScale before grace period", 10, 0, 2, 0, "inactive", 59, True, 2, "active"),
    ("scale down to minScale after grace period", 10, 0, 2, 0, "inactive", 60, True, 2, "active"),
    ("scales up", 1, 10, 0, 0, "active", 1000, True, 10, "active"),
    ("scales up to maxScale", 1, 10, 0, 8, "active", 1000, True, 8, "active"),
    ("scale up inactive revision", 1, 10, 0, 0, "inactive", 30, True, 10, "active"),
    ("does not scale up from zero with no metrics", 0, None, 0, 0, "inactive", 0, True, None, "inactive"),
    ("scales up from zero to desired one", 0, 1, 0, 0, "inactive", 1000, True, 1, "activating"),
    ("scales up from zero to desired high scale", 0, 10, 0, 0, "inactive", 1000, True, 10, "activating"),
    ("negative scale does not scale", 12, None, 0, 0, "active", 0, True, None, "active"),
    ("EnableScaleToZero == false and minScale == 0", 2, 0, 0, 0, "active", 1000, False, 1, "active"),
    ("EnableScaleToZero == false and minScale == 2", 5, 0, 2, 0, "active", 1000, False, 2, "active"),
    ("EnableScaleToZero == false and desire pod is -1(initial value)", 2, None, 0, 0, "active", 1000, False, None,
     "active"),
]


@pytest.mark.parametrize(
    ("current", "desired", "min_scale", "max_scale", "status", "age", "to_zero", "want", "want_status"),
    [pytest.param(*case[1:], id=case[0]) for case in SCALER],
)
def test_kpa_reconciler_scale_matches_upstream(
    *, current: int, desired: int | None, min_scale: int, max_scale: int, status: str, age: float, to_zero: bool,
    want: int | None, want_status: str,
) -> None:
    kpa = replace(RECONCILER, min_replicas=min_scale, max_replicas=max_scale, enable_scale_to_zero=to_zero)
    state = KpaState(started=True, pa_status=status, pa_since_s=NOW - age)
    applied, after = kpa_reconcile_scale(kpa, state, desired, current=current, ready=current, now=NOW)
    assert applied == want
    assert after.pa_status == want_status


# === KEDA =========================================================================================================


# kedacore/keda v2.20.2, pkg/scaling/executor/scale_scaledobjects_test.go, TestScaleToMinReplicasWhenNotActive
# (never active, initialCooldownPeriod 0: 10 -> 0), TestScaleToMinReplicasFromLowerInitialReplicaCount (1 -> 5) and
# TestScaleFromMinReplicasWhenActive (0 -> 1, LastActiveTime set)
@pytest.mark.parametrize(
    ("current", "active", "min_count", "want"),
    [pytest.param(10, False, 0, 0, id="TestScaleToMinReplicasWhenNotActive"),
     pytest.param(1, False, 5, 5, id="TestScaleToMinReplicasFromLowerInitialReplicaCount"),
     pytest.param(0, True, 0, 1, id="TestScaleFromMinReplicasWhenActive")],
)
def test_keda_request_scale_matches_upstream(current: int, active: bool, min_count: int, want: int) -> None:
    replicas, last_active = keda_request_scale(current, active, min_count, None, NOW, created_s=NOW - 3600)
    assert replicas == want
    assert (last_active == NOW) == active


# KEDA docs, ScaledObject spec, cooldownPeriod: "The period to wait after the last trigger reported active before
# scaling the resource back to 0" (default 300 s); RequestScale compares LastActiveTime + cooldown Before(now)
def test_keda_scales_to_zero_only_after_the_cooldown_since_the_last_active_poll() -> None:
    assert keda_request_scale(4, False, 0, NOW - 300, NOW) == (None, NOW - 300)
    assert keda_request_scale(4, False, 0, NOW - 301, NOW) == (0, NOW - 301)
    assert keda_request_scale(4, True, 0, NOW - 301, NOW) == (None, NOW)  # active: the HPA scales, time refreshed


# KEDA docs, ScaledObject spec, activationThreshold and the Prometheus scaler (`val > activationThreshold`): a
# value equal to the threshold does not activate; polls happen every pollingInterval (30 s)
def test_keda_activates_above_the_threshold_on_a_poll_only() -> None:
    keda = Keda(10.0, activation_threshold=2.0)
    n, _ = keda.decide(Observation(30, 0, 0, 2.0), KedaState())
    assert n == 0
    n, state = keda.decide(Observation(30, 0, 0, 2.5), KedaState())
    assert n == 1 and state.last_active_s == 30
    n, _ = keda.decide(Observation(45, 0, 0, 50.0), KedaState())
    assert n == 0  # 45 s is not a polling time, and the HPA does not scale from zero


# KEDA docs ("KEDA ... feeds the HPA"): between 1 and N the HPA that KEDA creates (minReplicas max(1,
# minReplicaCount), External metric, AverageValue target) scales: here 3 replicas at 100 rps against 10 -> 6
# (max(2 x 3, 4), no behavior)
def test_keda_leaves_one_to_n_to_its_hpa_on_an_external_metric() -> None:
    keda = Keda(10.0)
    n, state = keda.decide(Observation(45, 3, 0, 100.0), KedaState())
    assert n == 6
    assert state.hpa.recommendations is not None


# === Ray Serve: test_autoscaling_policy.py ========================================================================

LOOP_S = 0.1  # CONTROL_LOOP_INTERVAL_S


def ray(**kw: float | None) -> RayServe:
    params: dict[str, float | None] = {"target_ongoing_requests": 2.0, "min_replicas": 0, "max_replicas": 100}
    params.update(kw)
    return RayServe(**params)  # type: ignore[arg-type]


def desired(r: RayServe, running: int, total: float) -> int:
    """The policy's count with no delay (the tests of `_calculate_desired_num_replicas`)."""
    return ray_serve_policy(replace(r, upscale_delay_s=0.0, downscale_delay_s=0.0), running, running, total,
                            RayServeState(), now=0.0)[0]


# ray-project/ray 2.60.0, python/ray/serve/tests/test_autoscaling_policy.py, TestCalculateDesiredNumReplicas::
# test_bounds_checking (the bounds as Serve applies them after the policy)
def test_ray_bounds_checking() -> None:
    r = ray(target_ongoing_requests=100, min_replicas=9, max_replicas=11, upscale_delay_s=0.0, downscale_delay_s=0.0)
    for per_replica, want in [(150, 11), (50, 9)]:
        assert r.decide(Observation(0, 10, 0, math.nan, ongoing=per_replica * 10), RayServeState())[0] == want
    for i in range(50, 150):
        assert 9 <= r.decide(Observation(0, 10, 0, math.nan, ongoing=i * 10), RayServeState())[0] <= 11


# test_autoscaling_policy.py, TestCalculateDesiredNumReplicas::test_scale_up and test_scale_down
@pytest.mark.parametrize("target", [0.5, 1.0, 1.5])
def test_ray_scales_up_and_down_in_proportion(target: float) -> None:
    r = ray(target_ongoing_requests=target)
    assert 19 <= desired(r, 10, 2 * target * 10) <= 21
    assert 4 <= desired(r, 10, 0.5 * target * 10) <= 6


# test_autoscaling_policy.py, TestCalculateDesiredNumReplicas::test_scaling_factor, test_upscaling_factor and
# test_downscaling_factor (with the deprecated smoothing factors or the new ones)
@pytest.mark.parametrize(
    ("factors", "up_range", "down_range"),
    [pytest.param({"smoothing_factor": 0.5}, (24, 26), (5, 8), id="test_scaling_factor[smoothing]"),
     pytest.param({"upscaling_factor": 0.5, "downscaling_factor": 0.5}, (24, 26), (5, 8), id="test_scaling_factor"),
     pytest.param({"upscaling_factor": 0.5}, (24, 26), (1, 4), id="test_upscaling_factor"),
     pytest.param({"downscaling_factor": 0.5}, (39, 41), (5, 8), id="test_downscaling_factor")],
)
def test_ray_scaling_factors(factors: dict[str, float], up_range: tuple[int, int], down_range: tuple[int, int]
                             ) -> None:
    r = ray(**factors)
    assert up_range[0] <= desired(r, 10, 8.0 * 10) <= up_range[1]
    assert down_range[0] <= desired(r, 10, 0.25 * 10) <= down_range[1]


# test_autoscaling_policy.py, TestCalculateDesiredNumReplicas::test_downscaling_with_fractional_scaling_factor
@pytest.mark.parametrize(("replicas", "ratio", "factor"), [(2, 0.3, 0.5), (5, 0.4, 0.2), (10, 0.4, 0.1)])
def test_ray_fractional_downscaling_factor_still_removes_one(replicas: int, ratio: float, factor: float) -> None:
    r = ray(target_ongoing_requests=1, downscaling_factor=factor)
    assert desired(r, replicas, ratio * replicas) == replicas - 1


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_scaling_factor_scale_up_from_0_replicas
@pytest.mark.parametrize(("factor", "want"), [(10.0, 10), (0.5, 1)])
def test_ray_scale_up_from_zero_uses_the_upscaling_factor(factor: float, want: int) -> None:
    r = ray(max_replicas=2, upscaling_factor=factor)
    assert ray_serve_policy(r, 0, 0, 1, RayServeState(), now=0.0)[0] == want  # before the bounds


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_scaling_factor_scale_down_to_0_replicas
def test_ray_scale_down_to_zero_stops_at_one_first() -> None:
    r = ray(max_replicas=5, downscaling_factor=10.0, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert ray_serve_policy(r, 5, 5, 0, RayServeState(), now=0.0)[0] == 1
    assert ray_serve_policy(r, 1, 1, 0, RayServeState(), now=0.0)[0] == 0
    r = replace(r, downscaling_factor=0.2)
    n = 5
    for _ in range(5):
        n = ray_serve_policy(r, n, n, 0, RayServeState(), now=0.0)[0]
    assert n == 0


def ray_flow(r: RayServe, state: RayServeState, now: float, steps: Sequence[tuple[int, float, int]]
             ) -> tuple[RayServeState, float]:
    """Each step: (replicas running and targeted, total requests, expected decision within the bounds), one
    control loop apart."""
    for i, (n, total, want) in enumerate(steps):
        got, state = ray_serve_policy(r, n, n, total, state, now=now)
        assert max(r.min_replicas, min(r.max_replicas, got)) == want, (i, n, total)
        now += LOOP_S
    return state, now


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_upscale_downscale_delay (with
# downscale_to_zero_delay_s None and 300) and its `_run_upscale_downscale_flow`
@pytest.mark.parametrize("to_zero_delay", [None, 300.0])
def test_ray_upscale_downscale_delays(to_zero_delay: float | None) -> None:
    r = ray(target_ongoing_requests=1, max_replicas=2, upscale_delay_s=30.0, downscale_delay_s=600.0,
            downscale_to_zero_delay_s=to_zero_delay)
    up = int(30.0 / LOOP_S)
    down = int(600.0 / LOOP_S)
    to_zero = int((to_zero_delay or 600.0) / LOOP_S)
    assert ray_serve_policy(r, 0, 0, 1, RayServeState(), now=0.0)[0] == 1
    st, t = ray_flow(r, RayServeState(), 0.0, [(1, 100, 1)] * up + [(1, 100, 2)])
    st, t = ray_flow(r, st, t, [(2, 0, 2)] * down + [(2, 0, 1)])
    st, t = ray_flow(r, st, t, [(1, 0, 1)] * to_zero + [(1, 0, 0)])
    st, t = ray_flow(r, st, t, [(1, 100, 1)] * (up // 2) + [(1, 0, 1)])  # interrupted by a scale-down wish
    st, t = ray_flow(r, st, t, [(1, 100, 1)] * up + [(1, 100, 2)])
    st, t = ray_flow(r, st, t, [(2, 0, 2)] * (down // 2) + [(2, 100, 2)])  # interrupted by a scale-up wish
    st, t = ray_flow(r, st, t, [(2, 0, 2)] * down + [(2, 0, 1)])
    st, t = ray_flow(r, st, t, [(1, 0, 1)] * (to_zero // 2) + [(1, 100, 1)])
    ray_flow(r, st, t, [(1, 0, 1)] * to_zero + [(1, 0, 0)])


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_replicas_delayed_startup
def test_ray_replicas_delayed_startup() -> None:
    r = ray(target_ongoing_requests=1, min_replicas=1, max_replicas=200, upscale_delay_s=0.0,
            downscale_delay_s=100000.0)
    st = RayServeState()
    for running, target, total, want in [(1, 1, 100, 100), (1, 100, 100, 100), (3, 100, 123, 123),
                                         (4, 123, 10, 123)]:
        got, st = ray_serve_policy(r, running, target, total, st, now=0.0)
        assert got == want


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_fluctuating_ongoing_requests
@pytest.mark.parametrize("delay", [30.0, 0.0])
def test_ray_fluctuating_ongoing_requests(delay: float) -> None:
    r = ray(target_ongoing_requests=50, min_replicas=1, max_replicas=10, upscale_delay_s=delay,
            downscale_delay_s=delay)
    st, now = RayServeState(), 0.0
    for trial in range(1000):
        n, total = (1, 100) if trial % 2 == 0 else (2, 40)
        got, st = ray_serve_policy(r, n, n, total, st, now=now)
        now += LOOP_S
        assert got == (n if delay > 0 else (2 if n == 1 else 1)), trial


# test_autoscaling_policy.py, TestReplicaQueueLengthPolicy::test_single_replica_receives_all_requests
@pytest.mark.parametrize("ongoing", [20, 100, 10])
def test_ray_single_replica_receives_all_requests(ongoing: int) -> None:
    r = ray(target_ongoing_requests=5, min_replicas=1, max_replicas=50, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert ray_serve_policy(r, 4, 4, ongoing, RayServeState(), now=0.0)[0] == ongoing / 5


# test_autoscaling_policy.py, TestAutoscalingConfigParameters::test_apply_scaling_factors_upscale, _downscale and
# _stuck_downscale
@pytest.mark.parametrize(("factors", "want_from", "current", "want"),
                         [pytest.param({"upscaling_factor": 0.5}, 20, 10, 15, id="upscale"),
                          pytest.param({"downscaling_factor": 0.5}, 5, 20, 13, id="downscale"),
                          pytest.param({"downscaling_factor": 0.5}, 9, 10, 9, id="stuck downscale")])
def test_ray_apply_scaling_factors(factors: dict[str, float], want_from: int, current: int, want: int) -> None:
    assert ray_apply_scaling_factors(ray(**factors), want_from, current) == want


# test_autoscaling_policy.py, TestAutoscalingConfigParameters::test_apply_delay_logic_upscale and
# test_apply_delay_logic_downscale (4 -> 1 after downscale_delay_s, then 1 -> 0 after downscale_to_zero_delay_s).
# Upstream counted int(0.3 / 0.1) periods, which Python truncates to 2; Ray 2.60 measures the elapsed time, so the
# decision comes once 0.3 s have passed: the periods are rounded here.
def test_ray_apply_delay_logic() -> None:
    r = ray(min_replicas=1, max_replicas=10, upscale_delay_s=0.3)
    st, now = RayServeState(), 0.0
    for _ in range(round(0.3 / LOOP_S)):
        n, st = ray_apply_delay_logic(r, 5, 1, st, now)
        assert n == 1
        now += LOOP_S
    assert ray_apply_delay_logic(r, 5, 1, st, now)[0] == 5
    r = ray(max_replicas=10, downscale_to_zero_delay_s=0.4, downscale_delay_s=0.3)
    st, now = RayServeState(), 0.0
    for _ in range(round(0.3 / LOOP_S)):
        n, st = ray_apply_delay_logic(r, 0, 4, st, now)
        assert n == 4
        now += LOOP_S
    n, st = ray_apply_delay_logic(r, 0, 4, st, now)
    assert n == 1
    st, now = RayServeState(), now + LOOP_S
    for _ in range(round(0.4 / LOOP_S)):
        n, st = ray_apply_delay_logic(r, 0, 1, st, now)
        assert n == 1
        now += LOOP_S
    assert ray_apply_delay_logic(r, 0, 1, st, now)[0] == 0


# === AIBrix APA: algorithm/apa_test.go ============================================================================

# vllm-project/aibrix v0.7.0, pkg/controller/podautoscaler/algorithm/apa_test.go,
# TestAPAAlgorithm_ComputeTargetReplicas: pods, use per pod, target, max up rate, max down rate, want
# (tolerances 0.1 both ways in every case)
APA_CASES = [
    ("basic_scale_up", 2, 45, 30, 2, 2, 3),
    ("scale_up_upto_ceiling", 2, 35, 30, 2, 2, 3),
    ("scale_up_upto_max_scale_up", 2, 90, 30, 2, 2, 4),
    ("scale_up_upto_max_scale_up_ceiling", 2, 90, 30, 2.5, 2, 5),
    ("basic_scale_down", 6, 20, 30, 2, 2, 4),
    ("scale_down_upto_ceiling", 6, 18, 30, 2, 2, 4),
    ("scale_down_upto_max_scale_down", 6, 10, 30, 2, 2, 3),
    ("scale_down_upto_max_scale_down_floor", 6, 5, 30, 2, 2.5, 2),
    ("no_scaling_as_within_up_tolerance", 2, 33, 30, 2, 2, 2),
    ("no_scaling_as_within_down_tolerance", 2, 27, 30, 2, 2, 2),
    ("division_by_zero", 1, 10, 0, 1000, 2, 1),
]


@pytest.mark.parametrize(("pods_n", "use", "target", "up_rate", "down_rate", "want"),
                         [pytest.param(*c[1:], id=c[0]) for c in APA_CASES])
def test_aibrix_apa_compute_target_replicas_matches_upstream(
    *, pods_n: float, use: float, target: float, up_rate: float, down_rate: float, want: int
) -> None:
    assert apa_compute_target_replicas(pods_n, use, target, up_tolerance=0.1, down_tolerance=0.1,
                                       max_scale_up_rate=up_rate, max_scale_down_rate=down_rate) == want


# vllm-project/aibrix v0.7.0, pkg/controller/podautoscaler/podautoscaler_controller.go, stabilizeRecommendation (no
# upstream test; read from the source): a scale-down takes the LOWEST recommendation of the 300 s cooldown window,
# a scale-up (0 s window) the recommendation itself, an unchanged one the current count
def test_aibrix_cooldown_takes_the_lowest_recommendation_of_the_window_on_a_scale_down() -> None:
    recs = ((1, NOW - 200), (40, NOW - 100), (80, NOW - 10))
    assert aibrix_stabilize(recs, 60, 80, up_window_s=0.0, down_window_s=300.0, now=NOW)[0] == 1
    assert aibrix_stabilize(recs, 90, 80, up_window_s=0.0, down_window_s=300.0, now=NOW)[0] == 90
    assert aibrix_stabilize(recs, 80, 80, up_window_s=0.0, down_window_s=300.0, now=NOW)[0] == 80
    old = ((1, NOW - 301),)
    assert aibrix_stabilize(old, 60, 80, up_window_s=0.0, down_window_s=300.0, now=NOW)[0] == 60


# vllm-project/aibrix v0.7.0, podautoscaler_controller.go computeScaleDecision and autoscaler.go (read from the
# source): the current count is spec.replicas (loading pods included) while the per-pod value averages the pods
# that answered, i.e. the ready ones; so with 1 ready pod at 4x the target and 3 loading, APA asks for
# ceil(4 x 4) capped at 2 x 4 = 8
def test_aibrix_apa_multiplies_all_replicas_by_the_ready_pods_use() -> None:
    apa = AibrixApa(10.0)
    n, state = apa.decide(Observation(NOW, 1, 3, 40.0), AibrixApaState())
    assert n == 8
    assert state.samples == ((NOW, 40.0),)
