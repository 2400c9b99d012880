"""The simulator and the controller make the same decisions: one observation sequence, two paths.

The simulator runs a scenario (an example InferenceService over a traffic trace) and records, at every control
cycle, what infer-ctl observed and planned. Each observation is then replayed through the controller's own path:
the manifest through the controller's spec check, the replicas turned into the Pods the controller would list
(labels, annotations, priority class, creation and Ready timestamps), `observation_of` building the cycle's
observation from them, `cycle_policies` the settings, and `plan_cycle` with the controller's own state. Every
plan must be identical: counts, reason, message, replica actions, the new replicas' names and roles.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infer_ctl.actuate.manifests import PRIORITY_CLASS_SERVING, PRIORITY_CLASS_STANDBY, spec_hash
from infer_ctl.config.policies import load_policies
from infer_ctl.controller.reconciler import Settings, cycle_policies, observation_of
from infer_ctl.core import api
from infer_ctl.core.conditions import rfc3339
from infer_ctl.engine.burst import BurstBasis, burst_basis, burst_due
from infer_ctl.engine.cycle import CyclePlan, CycleState, Observation, plan_cycle
from infer_ctl.kube.inferenceservice import check_inference_service
from infer_ctl.kube.labels import (
    ANNOTATION_ACCELERATOR,
    ANNOTATION_CACHED,
    ANNOTATION_SPEC_HASH,
    LABEL_REPLICA,
    LABEL_ROLE,
    ROLE_SERVING,
    ROLE_STANDBY,
)
from infer_ctl.sim.catalogue import build_policy, initial_replicas
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import scenario_manifest, settings_from_manifest
from infer_ctl.sim.tick import SimConfig, arrivals_per_tick
from infer_ctl.sim.trace import step_profile

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"


def _time(seconds: float) -> str:
    return rfc3339(datetime.fromtimestamp(seconds, UTC))


def pod_of(svc: api.InferenceService, r: Any) -> dict[str, Any]:
    """The Pod the controller would list for a simulated replica."""
    ready = r.state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY)
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if ready:
        # the replicas running when the trace starts have no cold start to measure: no transition time
        since = {} if r.cold_start_s is None else {"lastTransitionTime": _time(r.created_s + r.cold_start_s)}
        conditions.append({"type": "Ready", "status": "True", **since})
    return {
        "metadata": {"name": r.name, "namespace": svc.meta.namespace, "uid": f"uid-{r.name}",
                     "creationTimestamp": _time(r.created_s or 0.0),
                     "labels": {LABEL_REPLICA: r.name, LABEL_ROLE: ROLE_STANDBY if r.standby else ROLE_SERVING},
                     "annotations": {ANNOTATION_SPEC_HASH: spec_hash(svc.spec), ANNOTATION_ACCELERATOR: r.accelerator,
                                     ANNOTATION_CACHED: str(r.cached).lower()}},
        "spec": {"priorityClassName": PRIORITY_CLASS_STANDBY if r.low_priority else PRIORITY_CLASS_SERVING},
        "status": {"conditions": conditions},
    }


def summary(plan: CyclePlan) -> tuple[Any, ...]:
    return (plan.serving, plan.standby, plan.reason, plan.message, plan.actions,
            tuple((r.name, r.standby) for r in plan.create), plan.scaled)


@pytest.mark.parametrize(("example", "profile", "cold_start_s"), [
    pytest.param("llm-8b.yaml", (20.0, 300.0, 40.0, 0.0, 120.0), 180.0,
                 id="an 8B model with a standby replica through a surge, a drop, idle and a return"),
    pytest.param("scale-to-zero.yaml", (10.0, 0.0, 0.0, 25.0, 0.0, 0.0), 60.0,
                 id="a small model that scales to zero and wakes"),
])
def test_every_cycle_of_the_simulator_is_the_controllers_decision(example: str, profile: tuple[float, ...],
                                                                 cold_start_s: float) -> None:
    settings = settings_from_manifest(EXAMPLES / example, cold_start_s)
    trace = step_profile(profile, 900.0)
    tick_s = 5.0
    arrivals = arrivals_per_tick(trace, tick_s, 1.0, np.random.default_rng(3))
    policy = build_policy("infer-ctl", settings, arrivals, tick_s)
    recorded: list[tuple[Observation, CyclePlan]] = []
    result = simulate(arrivals, policy, settings.model, SimConfig(tick_s=tick_s, seed=3),
                      initial_replicas=initial_replicas(arrivals, tick_s, settings.model),
                      on_cycle=lambda obs, plan: recorded.append((obs, plan)))

    # the controller's path: its spec check, its settings, its observation of Pods
    manifest = scenario_manifest(settings)
    policies = load_policies()
    check = check_inference_service(manifest, policies.catalog)
    assert check.ok and check.service is not None, check.errors
    svc = check.service
    controller = cycle_policies(Settings(policies, prometheus_url="http://prometheus.invalid"))
    state = CycleState()
    reasons = set()
    basis: BurstBasis | None = None
    for i, (sim_observation, sim_plan) in enumerate(recorded):
        now_s = sim_observation.samples[0][0]
        if now_s % controller.period_s:
            # a cycle between two periods: the controller's check (its basis from its own settings) calls for it
            serving = sum(r.state is api.ReplicaState.SERVING for r in sim_observation.replicas)
            assert burst_due(basis, in_flight=sim_observation.concurrency, serving=serving), f"cycle {i}"
        pods = [pod_of(svc, r) for r in sim_observation.replicas]
        # the requests in flight, as the controller reads them beside the rate and passes them on (the reconciler)
        observation = replace(observation_of(svc, pods, (), sim_observation.samples),
                              concurrency=sim_observation.concurrency)
        plan, state = plan_cycle(observation, state, controller, now_s)
        assert summary(plan) == summary(sim_plan), f"cycle {i} at {now_s:.0f} s"
        basis = burst_basis(svc.spec, controller, wanted=plan.serving, in_flight=observation.concurrency)
        reasons.add(plan.reason)
    # the sequence exercised the decision, not only a steady state; the checks between periods ran cycles too
    assert len(recorded) == len(arrivals) * tick_s // controller.period_s + result.burst_cycles
    assert len(reasons) >= 4, reasons
    assert any(p.create for _, p in recorded) and any(p.actions.remove for _, p in recorded)
    # the requests in flight are read beside the rate from the first scrape on (and replayed above)
    assert all(not math.isnan(o.concurrency) for o, _ in recorded if o.samples[0][0] >= policy.metric_scrape_s)
