"""The peers' autoscalers other than the HPA, as the simulator runs them: Knative's KPA, KEDA, Ray Serve and
AIBrix's APA (see `infer_ctl.sim.autoscaler`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from infer_ctl.sim.autoscaler import Observation, Pipeline
from infer_ctl.sim.hpa import Hpa, HpaState, Recommendation

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
