"""Status: the InferenceService's status and conditions, built by pure functions over what a cycle observed and
planned (as Knative's KPA computes its conditions), and written once, only the fields that changed
(`StatusWriter`).

The conditions, and what sets each:
- Valid: the spec passed the parser and catalog checks (False: InvalidSpec, nothing else is built).
- Ready: the serving replicas ready are at least the plan's serving count.
- Placed: False with FailedCreate or QuotaExceeded when the API server refused a replica (first), with the
  placement's reason when a replica could not be placed, Unschedulable while one is pending; else True.
- Scaling: True while the plan moves replicas or some load; its reason and message are the decision's.
- Deferred: True (GangPending) while this service holds back for pending gangs, or a replica waits on their GPUs.
- MetricsAvailable: False while the request rate cannot be read (replicas held), True with its source.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from infer_ctl.actuate.manifests import serving_label_selector
from infer_ctl.controller.events import Call
from infer_ctl.controller.observe import Observed
from infer_ctl.core import api
from infer_ctl.core.conditions import rfc3339, set_condition
from infer_ctl.engine.cycle import CyclePlan, CycleState
from infer_ctl.engine.placement import ReplicaPlacement
from infer_ctl.kube.client import INFERENCE_SERVICES, KubeClient, KubeError
from infer_ctl.kube.labels import LABEL_REPLICA


def conditions_of(body: Mapping[str, Any]) -> tuple[api.Condition, ...]:
    out = []
    for c in ((body.get("status") or {}).get("conditions") or ()):
        if isinstance(c, Mapping) and c.get("type") and c.get("status"):
            out.append(api.Condition(type=str(c["type"]), status=str(c["status"]), reason=str(c.get("reason", "")),
                                     message=str(c.get("message", "")),
                                     last_transition_time=str(c.get("lastTransitionTime", "")),
                                     observed_generation=int(c.get("observedGeneration") or 0)))
    return tuple(out)


def invalid_status(conditions: tuple[api.Condition, ...], message: str, now: datetime, generation: int
                   ) -> dict[str, Any]:
    """The status of a service whose spec did not pass the checks: Valid=False, and nothing else."""
    conditions = set_condition(conditions, type=api.ConditionType.VALID, status="False", reason="InvalidSpec",
                               message=message[:4000], now=now, generation=generation)
    return {"observedGeneration": generation, "conditions": [c.to_dict() for c in conditions]}


def valid_conditions(conditions: tuple[api.Condition, ...], now: datetime, generation: int
                     ) -> tuple[api.Condition, ...]:
    return set_condition(conditions, type=api.ConditionType.VALID, status="True", reason="SpecValid",
                         message="the spec passed the parser and catalog checks", now=now, generation=generation)


def build_status(o: Observed, state: CycleState, plan: CyclePlan, refused: str,
                 conditions: tuple[api.Condition, ...]) -> dict[str, Any]:
    """The status of a cycle that planned: counts, conditions, forecast, attainment, cold starts, placements."""
    g, now = o.generation, o.now
    states = Counter(o.state(r) for r in o.replicas)
    gone = Counter(o.state(r) for r in o.replicas if r.name in plan.unavailable)
    states -= gone
    counts = api.ReplicaCounts(ready=states[api.ReplicaState.SERVING] + states[api.ReplicaState.STANDBY],
                               serving=states[api.ReplicaState.SERVING],
                               standby=states[api.ReplicaState.STANDBY],
                               loading=states[api.ReplicaState.LOADING] + states[api.ReplicaState.PENDING],
                               unavailable=len(plan.unavailable), sleeping=states[api.ReplicaState.SLEEPING])
    ready = counts.serving >= plan.serving
    conditions = set_condition(conditions, type=api.ConditionType.READY, status="True" if ready else "False",
                               reason="Ready" if ready else "ReplicasNotReady",
                               message=f"{counts.serving}/{plan.serving} serving replicas ready, "
                                       f"{counts.standby}/{plan.standby} standby", now=now, generation=g)
    failed = [p for p in plan.placements if not p.placed]
    pending = [r for r in o.replicas if r.state is api.ReplicaState.PENDING]
    if refused:
        conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                   reason="QuotaExceeded" if "exceeded quota" in refused else "FailedCreate",
                                   message=refused[:4000], now=now, generation=g)
    elif failed:
        conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                   reason=reason_code(failed[0]),
                                   message=f"{len(failed)} replica(s) not placed: {failed[0].why_not}", now=now,
                                   generation=g)
    elif pending:
        conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="False",
                                   reason="Unschedulable",
                                   message=f"{pending[0].name}: {pending[0].scheduled_message}", now=now,
                                   generation=g)
    else:
        conditions = set_condition(conditions, type=api.ConditionType.PLACED, status="True", reason="Placed",
                                   message="every replica has its devices", now=now, generation=g)
    moving = not plan.actions.empty or counts.loading > 0
    # The reason is the decision's, moving or not (Scaling=False with Stabilizing: a lower count is wanted,
    # the window holds).
    conditions = set_condition(conditions, type=api.ConditionType.SCALING, status="True" if moving else "False",
                               reason=plan.reason, message=plan.message or plan.reason, now=now, generation=g)
    gang_blocked = [p for p in failed if any(r.plugin == "GangReservation" for r in p.decision.status.reasons)]
    if plan.deferred or gang_blocked:
        why = plan.deferred or f"{len(gang_blocked)} replica(s) not placed: GPUs held for pending gangs"
        conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="True",
                                   reason="GangPending", message=why, now=now, generation=g)
    else:
        conditions = set_condition(conditions, type=api.ConditionType.DEFERRED, status="False",
                                   reason="NoPendingGang", message="no pending gang needs this service's GPUs",
                                   now=now, generation=g)
    if o.rates.error:
        conditions = set_condition(conditions, type="MetricsAvailable", status="False",
                                   reason=o.rates.reason or "MetricsMissing",
                                   message=f"{o.rates.error}; holding replicas (no scale-down on missing data)",
                                   now=now, generation=g)
    else:
        conditions = set_condition(conditions, type="MetricsAvailable", status="True", reason="MetricsRead",
                                   message=f"request rate from {o.rates.source}", now=now, generation=g)
    forecast = None
    fc = plan.output.forecast
    if fc is not None:
        horizon = plan.output.decision.horizon_s
        forecast = api.ForecastStatus(rate_rps=fc.mean_at(now.timestamp() + horizon),
                                      upper_rps=fc.peak_upper_rps(horizon, now.timestamp()), horizon_s=horizon,
                                      method=fc.method + (f" ({note})" if (note := plan.output.fit_note) else ""),
                                      quantile=fc.quantile)
    cold_starts = state.cold_starts
    cold = tuple(api.ColdStartStatus(accelerator=acc or "unknown", cached=cached,
                                     p50_s=est.p50_s, p90_s=est.p90_s, samples=est.samples)
                 for acc, cached in cold_starts.measured_keys() for est in [cold_starts.estimate(acc, cached)])
    devices = allocated_devices(o.claims)
    placed = tuple(api.PlacementStatus(replica=r.name, node=r.node, devices=devices.get(r.name, ()),
                                       product=r.accelerator, state=o.state(r)) for r in o.replicas)
    status = api.InferenceServiceStatus(
        observed_generation=g, replicas=counts, desired=api.DesiredReplicas(plan.serving, plan.standby),
        selector=serving_label_selector(o.svc.meta),
        # no rate was read this cycle: none is reported (not the last one read)
        observed_rps=None if o.rates.error or math.isnan(plan.output.observed_rps) else plan.output.observed_rps,
        forecast=forecast, slo=with_aim(o.slo, state),
        cold_starts=cold, placements=placed,
        last_decision=state.last_decision, conditions=conditions)
    return status.to_dict()


def metrics_transition(before: Sequence[api.Condition], status: Mapping[str, Any]
                       ) -> tuple[str, str, str] | None:
    """The Event (reason, note, type) when the rate becomes unreadable (or unreadable for another reason), or when
    it is back; None when MetricsAvailable did not change."""
    was = next((c for c in before if c.type == "MetricsAvailable"), None)
    cond = next((c for c in status.get("conditions") or () if c.get("type") == "MetricsAvailable"), None)
    if cond is None or (was is not None and (was.status, was.reason) == (cond["status"], cond["reason"])):
        return None
    if cond["status"] == "False":
        return "MetricsUnavailable", f"{cond['reason']}: {cond['message']}", "Warning"
    if was is not None and was.status == "False":
        return "MetricsAvailable", cond["message"], "Normal"
    return None


def with_aim(slo: api.SloStatus | None, state: CycleState) -> api.SloStatus | None:
    """The status' attainment with the aim the scaling runs with, for a service whose aim moves with it."""
    policy = state.resolved[1] if state.resolved is not None else None
    if slo is None or policy is None or not policy.aim_rungs or state.aim.rung is None:
        return slo
    rung = policy.aim_rungs[state.aim.rung]
    return replace(slo, aim=api.AimStatus(rung.quantile, rung.scale_down_stabilization_s,
                                          rfc3339(datetime.fromtimestamp(state.aim.since_s, UTC)), state.aim.note,
                                          rung.headroom))


def reason_code(placement: ReplicaPlacement) -> str:
    reasons = placement.decision.status.reasons
    return f"No{reasons[-1].plugin}" if reasons else "Unschedulable"


def refusal_code(exc: KubeError) -> str:
    return "QuotaExceeded" if "exceeded quota" in exc.message else f"FailedCreate{exc.reason or exc.status}"


def allocated_devices(claims: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """replica -> the pool/device its claim was allocated, for the replicas whose claim is allocated."""
    out: dict[str, tuple[str, ...]] = {}
    for claim in claims:
        replica = ((claim.get("metadata") or {}).get("labels") or {}).get(LABEL_REPLICA)
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if replica and results:
            out[str(replica)] = tuple(f"{r.get('pool')}/{r.get('device')}" for r in results)
    return out


def status_changes(written: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status fields a cycle's `status` changes against what the object shows (`written`): what the
    operator merges into the status subresource. A status that says what the object already says is not written
    again: an idle service's cycles would otherwise PATCH it every period."""
    return {k: v for k, v in status.items() if written.get(k) != v}


class StatusWriter:
    """Writes a cycle's status: the changed top-level fields, merged into the status subresource, once."""

    def __init__(self, kube: KubeClient, call: Call) -> None:
        self.kube, self._k = kube, call

    async def write(self, body: Mapping[str, Any], changed: Mapping[str, Any]) -> None:
        """Merge the changed status fields into the status subresource (raises KubeError when refused)."""
        meta = body.get("metadata") or {}
        await self._k(self.kube.merge_patch, INFERENCE_SERVICES, meta["name"], {"status": dict(changed)},
                      meta.get("namespace"), subresource="status")

    async def write_changes(self, body: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
        """Write what `status` changes against the object's (nothing when it changes nothing); returns it."""
        changed = status_changes(body.get("status") or {}, status)
        if changed:
            await self.write(body, changed)
        return changed
