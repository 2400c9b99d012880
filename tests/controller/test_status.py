"""The status builder alone (`infer_ctl.controller.status`): its conditions as a table of cases over values (no
API server), each a sentence, and the Event a MetricsAvailable transition makes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.controller.observe import Observed, observation_of
from infer_ctl.controller.settings import Settings, cycle_policies
from infer_ctl.controller.status import (
    build_status,
    conditions_of,
    invalid_status,
    metrics_transition,
    status_changes,
    valid_conditions,
)
from infer_ctl.core import api
from infer_ctl.engine.cycle import CyclePlan, CycleState, plan_cycle
from infer_ctl.engine.replicas import ReplicaActions
from infer_ctl.kube.inferenceservice import check_inference_service
from infer_ctl.kube.pods import ReplicaPod
from infer_ctl.observe.rates import RateSamples
from tests.builders import InferenceServiceBuilder

T0 = datetime(2026, 12, 8, 1, 0, tzinfo=UTC)
POLICIES = load_policies()


def service() -> api.InferenceService:
    svc = check_inference_service(InferenceServiceBuilder().build(), POLICIES.catalog,
                                  runtimes=POLICIES.runtimes).service
    assert svc is not None
    return svc


def a_plan(svc: api.InferenceService, **changes: Any) -> tuple[CyclePlan, CycleState]:
    """A real plan of the pure cycle (no cluster to place on, a steady 1 request/s), then the case's changes."""
    samples = tuple((T0.timestamp() - 10 * k, 1.0) for k in range(30, 0, -1))
    plan, state = plan_cycle(observation_of(svc, [], [], samples), CycleState(), cycle_policies(Settings(POLICIES)),
                             T0.timestamp())
    return replace(plan, **changes), state


def replica(name: str, state: api.ReplicaState, scheduled: str = "") -> ReplicaPod:
    return ReplicaPod(name, state, state is api.ReplicaState.STANDBY, "node-1", "H100", False, T0, None, scheduled)


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


READ = RateSamples(((T0.timestamp(), 1.0),), "prometheus")
UNREAD = RateSamples((), "prometheus", error="Prometheus answered 503", reason="HTTPError")

CASES = {
    "every wanted serving replica ready: Ready": (
        dict(serving=1, standby=0), [replica("r0", api.ReplicaState.SERVING)], READ, "",
        {"Ready": ("True", "Ready"), "Placed": ("True", "Placed"), "MetricsAvailable": ("True", "MetricsRead")}),
    "a serving replica still loading: not Ready": (
        dict(serving=2, standby=0), [replica("r0", api.ReplicaState.SERVING), replica("r1", api.ReplicaState.LOADING)],
        READ, "", {"Ready": ("False", "ReplicasNotReady"), "Scaling": ("True", None)}),
    "a replica the API server refused: Placed=False FailedCreate": (
        dict(serving=1), [], READ, "the API server refused replica r0: admission webhook denied",
        {"Placed": ("False", "FailedCreate")}),
    "a replica refused by a quota: Placed=False QuotaExceeded": (
        dict(serving=1), [], READ, "the API server refused replica r0: exceeded quota: gpus",
        {"Placed": ("False", "QuotaExceeded")}),
    "a replica the scheduler has not bound: Placed=False Unschedulable": (
        dict(serving=1), [replica("r0", api.ReplicaState.PENDING, "0/3 nodes are available")], READ, "",
        {"Placed": ("False", "Unschedulable")}),
    "the rate unreadable: MetricsAvailable=False with the outage's reason": (
        dict(serving=1), [replica("r0", api.ReplicaState.SERVING)], UNREAD, "",
        {"MetricsAvailable": ("False", "HTTPError")}),
    "held back for a pending gang: Deferred": (
        dict(serving=1, deferred="1 GPU held for the gang train/a"), [replica("r0", api.ReplicaState.SERVING)], READ,
        "", {"Deferred": ("True", "GangPending")}),
    "nothing to move and nothing loading: not Scaling, with the decision's reason": (
        dict(serving=1, standby=0, actions=ReplicaActions()), [replica("r0", api.ReplicaState.SERVING)], READ, "",
        {"Scaling": ("False", None), "Deferred": ("False", "NoPendingGang")}),
}


@pytest.mark.parametrize(("changes", "replicas", "rates", "refused", "want"), list(CASES.values()), ids=list(CASES))
def test_the_conditions(changes: dict[str, Any], replicas: list[ReplicaPod], rates: RateSamples, refused: str,
                        want: dict[str, tuple[str, str | None]]) -> None:
    svc = service()
    plan, state = a_plan(svc, **changes)
    observed = Observed(svc, 3, T0, tuple(replicas), (), rates)
    status = build_status(observed, state, plan, refused, valid_conditions((), T0, 3))
    got = conditions(status)
    assert got["Valid"] == ("True", "SpecValid")
    for kind, (status_, reason) in want.items():
        assert got[kind][0] == status_, (kind, got[kind])
        assert reason is None or got[kind][1] == reason, (kind, got[kind])
    assert got["Scaling"][1] == plan.reason  # the decision's reason, moving or not
    assert status["observedGeneration"] == 3 and all(c["observedGeneration"] == 3 for c in status["conditions"])
    if rates.error:  # no rate read this cycle: none reported (not the last one read)
        assert "observedRps" not in status


def test_an_invalid_spec_has_only_valid_false_and_the_generation() -> None:
    status = invalid_status((), "spec.model.name: unknown model", T0, 4)
    assert status == {"observedGeneration": 4, "conditions": [
        {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": "spec.model.name: unknown model",
         "lastTransitionTime": status["conditions"][0]["lastTransitionTime"], "observedGeneration": 4}]}


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = valid_conditions((), T0, 1)
    body = {"status": {"conditions": [c.to_dict() for c in first]}}
    again = valid_conditions(conditions_of(body), T0 + timedelta(minutes=5), 2)
    assert again[0].last_transition_time == first[0].last_transition_time and again[0].observed_generation == 2


TRANSITIONS = {
    "the rate becomes unreadable: a Warning": (("True", "MetricsRead"), ("False", "HTTPError"),
                                              ("MetricsUnavailable", "Warning")),
    "unreadable for another reason: a Warning again": (("False", "HTTPError"), ("False", "Timeout"),
                                                       ("MetricsUnavailable", "Warning")),
    "the rate is back: a Normal Event": (("False", "HTTPError"), ("True", "MetricsRead"),
                                         ("MetricsAvailable", "Normal")),
    "still readable: nothing": (("True", "MetricsRead"), ("True", "MetricsRead"), None),
    "readable from the first cycle: nothing": (None, ("True", "MetricsRead"), None),
}


@pytest.mark.parametrize(("before", "after", "want"), list(TRANSITIONS.values()), ids=list(TRANSITIONS))
def test_metrics_transitions(before: tuple[str, str] | None, after: tuple[str, str],
                             want: tuple[str, str] | None) -> None:
    was = () if before is None else (api.Condition("MetricsAvailable", before[0], before[1], "", "", 0),)
    status = {"conditions": [{"type": "MetricsAvailable", "status": after[0], "reason": after[1], "message": "m"}]}
    got = metrics_transition(was, status)
    assert (None if got is None else (got[0], got[2])) == want


def test_only_the_changed_fields_are_written() -> None:
    assert status_changes({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 4}) == {"b": {"c": 3}, "d": 4}
    assert status_changes({"a": 1}, {"a": 1}) == {}
